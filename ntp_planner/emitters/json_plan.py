"""JSON: the exported layout in ntp-planner's own vocabulary, for scripts."""

from __future__ import annotations

import json

from ntp_planner.emitters.common import Export, expressible_layout, launch_geometry
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult


def emit(
    plan: Plan, replan: ReplanResult | None = None, data_path: str | None = None, save_dir: str | None = None
) -> Export:
    layout, warnings = expressible_layout(plan, "A uniform export")
    hosts, per_host = launch_geometry(plan)
    data = {
        "model": plan.model.name,
        "hosts": hosts,
        "gpus_per_host": per_host,
        "layout": layout.model_dump(mode="json"),
        "planned_layout": plan.layout.model_dump(mode="json"),
        "per_layer_tp": plan.per_layer_tp,
        "predicted": {"step_time_s": plan.predicted.step_time_s, "mfu": plan.predicted.mfu},
    }
    return Export(files={"plan_export.json": json.dumps(data, indent=1) + "\n"}, warnings=warnings)
