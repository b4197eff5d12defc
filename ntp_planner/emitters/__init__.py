"""Export a Plan to training frameworks: one module per target, each a table from ntp-planner's
vocabulary to the target's names. Only modules in this package spell external flag names."""

from __future__ import annotations

from ntp_planner.emitters import bridge, json_plan, megatron, nemo, nemo2
from ntp_planner.emitters.common import Export
from topologies.errors import InputError

FORMATS = {
    "megatron": megatron.emit,
    "nemo": nemo.emit,
    "nemo2": nemo2.emit,
    "bridge": bridge.emit,
    "json": json_plan.emit,
}


def export(plan, fmt: str, replan=None, data_path: str | None = None, save_dir: str | None = None) -> Export:
    if fmt not in FORMATS:
        raise InputError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    return FORMATS[fmt](plan, replan=replan, data_path=data_path, save_dir=save_dir)


__all__ = ["FORMATS", "Export", "export"]
