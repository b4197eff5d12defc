"""Export a Plan to training frameworks: one module per target, each a table from ntp-planner's
vocabulary to the target's names. Only modules in this package spell external flag names."""

from __future__ import annotations

from ntp_planner.emitters import bridge, json_plan, megatron, nemo, nemo2, torchtitan
from ntp_planner.emitters.common import Export
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult
from topologies.errors import InputError

FORMATS = {
    "megatron": megatron.emit,
    "nemo": nemo.emit,
    "nemo2": nemo2.emit,
    "bridge": bridge.emit,
    "torchtitan": torchtitan.emit,
    "json": json_plan.emit,
}
# Every file a target may write: an export replaces an earlier one of the same target whole.
EXPORT_FILES = {
    "megatron": ("launch_megatron.sh", "megatron_args.json", "nonuniform_tp.json", "nonuniform_tp_config.py"),
    "nemo": ("nemo_config.yaml",),
    "nemo2": ("nemo2_recipe.py",),
    "bridge": ("bridge_override.yaml",),
    "torchtitan": ("torchtitan_config.py", "launch_torchtitan.sh"),
    "json": ("plan_export.json",),
}
# What each target does with the export options: the field it writes them to, or, where it has
# none, why the option is refused (an option is never dropped without a word).
OPTION_FIELDS = {
    "replan": {
        "megatron": "nonuniform_tp.json (Megatron's nonuniform-TP settings) and nonuniform_tp_config.py (its loader)",
        "nemo": None,
        "nemo2": None,
        "bridge": None,
        "torchtitan": None,
        "json": None,
    },
    "data_path": {
        "megatron": "--data-path",
        "nemo": "model.data.data_prefix",
        "nemo2": "recipe.data = PreTrainingDataModule(paths=[...])",
        "bridge": "dataset.data_path",
        "torchtitan": "dataloader.dataset_path (a local copy of the recipe's dataset)",
        "json": None,
    },
    "save_dir": {
        "megatron": "--save and --load",
        "nemo": "exp_manager.exp_dir",
        "nemo2": "recipe.log.log_dir",
        "bridge": "checkpoint.save",
        "torchtitan": "checkpoint.folder, with checkpoint.enable",
        "json": None,
    },
}
OPTION_NAMES = {"replan": "--replan", "data_path": "--data-path", "save_dir": "--save-dir"}
REFUSED = {
    "replan": "{fmt} cannot express a re-planned state (per-replica TP degrees); only Megatron-LM's nonuniform TP "
    "can: export with --format megatron or drop --replan",
    "data_path": "the {fmt} export holds the layout only and has no data path field; drop --data-path and give the "
    "data to your launcher",
    "save_dir": "the {fmt} export holds the layout only and has no checkpoint folder field; drop --save-dir",
}


def check_options(fmt: str, **given) -> None:
    """Refuse an export option the target ``fmt`` has no field for, and an empty path."""
    for option, value in given.items():
        if value is None:
            continue
        if isinstance(value, str) and not value.strip():
            raise InputError(f"{OPTION_NAMES[option]} {value!r} is empty; give a path or drop the option")
        if OPTION_FIELDS[option].get(fmt, "") is None:
            raise InputError(f"{OPTION_NAMES[option]}: " + REFUSED[option].format(fmt=fmt))


def check_format(plan) -> None:
    """Refuse to export a number format the cluster's GPU has no tensor cores for: a launch file
    for it would fail on the cluster (or run another format than the one planned)."""
    gpu = plan.cluster.build().gpu
    dtype = plan.training.dtype
    if not gpu.supports(dtype):
        from topologies.gpus import FORMATS as NUMBER_FORMATS

        runs = ", ".join(f for f in NUMBER_FORMATS if gpu.supports(f))
        raise InputError(
            f"the plan trains in {dtype} but the cluster's {gpu.name} ({gpu.architecture}) has no {dtype} tensor "
            f"cores (it runs {runs}); re-plan with --dtype one of those"
        )


def export(
    plan: Plan, fmt: str, replan: ReplanResult | None = None, data_path: str | None = None, save_dir: str | None = None
) -> Export:
    if fmt not in FORMATS:
        raise InputError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    check_options(fmt, replan=replan, data_path=data_path, save_dir=save_dir)
    check_format(plan)
    return FORMATS[fmt](plan, replan=replan, data_path=data_path, save_dir=save_dir)


__all__ = ["EXPORT_FILES", "FORMATS", "OPTION_FIELDS", "Export", "check_format", "check_options", "export"]
