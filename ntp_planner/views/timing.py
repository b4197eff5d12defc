"""Predicted against measured, rendered: the comparison `ntp validate --profile` prints and `ntp
calibrate`'s fit. The comparison itself is ``executor.check.timing``'s; nothing here prints or
imports torch."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from cost_models.profile import Profile
from ntp_planner.executor.check.timing import relative_error

SPLIT_LABELS = {
    "compute": "compute (forward, backward, recompute)",
    "tp_comm": "TP collectives",
    "cp_comm": "CP collectives",
    "pp_wait": "pipeline sends and bubble",
    "dp_sync": "DP gradient sync",
    "optimizer": "optimizer and fixed overhead",
    "ep_comm": "EP all-to-alls",
}
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def kib(nbytes: float) -> str:
    return f"{nbytes / 1024:,.1f} KiB"


def comparison_view(data: dict) -> Group:
    """The step, its split, each stage's busy time and memory: predicted, measured, error."""
    head = Table(show_header=False, box=None)
    err = data["step_time_error"]
    head.add_row(
        "step time",
        f"predicted {ms(data['predicted_step_time_s'])}, measured {ms(data['measured_step_time_s'])} "
        f"(median of the steady steps), error {err:+.1%}",
    )
    split = Table(title="Where the step goes (slowest rank)", box=box.SIMPLE_HEAD)
    for col in ("part", "predicted", "measured"):
        split.add_column(col, justify="left" if col == "part" else "right")
    for k, v in data["time_split_s"].items():
        if v["predicted"] > 0 or v["measured"] > 0:
            split.add_row(SPLIT_LABELS.get(k, k), ms(v["predicted"]), ms(v["measured"]))
    stages = Table(title="Per stage: compute and TP communication over the step", box=box.SIMPLE_HEAD)
    for col in ("stage", "predicted", "measured"):
        stages.add_column(col, justify="right")
    memory = Table(title="Memory per rank (the fullest of each stage)", box=box.SIMPLE_HEAD)
    for col in ("stage", "part", "predicted", "measured"):
        memory.add_column(col, justify="left" if col == "part" else "right")
    for s in data["stages"]:
        stages.add_row(str(s["stage"]), ms(s["predicted_busy_s"]), ms(s["measured_busy_s"]))
        pred, meas = s["predicted_memory_bytes"], s["measured_memory_bytes"]
        for part in MEMORY_PARTS:
            memory.add_row(str(s["stage"]), part, kib(pred.get(part, 0.0)), kib(meas.get(part, 0.0)))
    notes = [Text(f"  {n}") for n in data["prediction_notes"]]
    return Group(head, split, stages, memory, *([Text("Prediction notes:", style="yellow"), *notes] if notes else []))


def calibration_view(profile: Profile) -> Group:
    """The fitted constants and every run's error before and after."""
    cal = profile.calibration
    head = Table(show_header=False, box=None)
    head.add_row("compute multiplier", f"{cal.compute_scale:.3f}")
    head.add_row("communication multiplier", f"{cal.comm_scale:.3f}")
    head.add_row("per-step overhead", ms(cal.step_overhead_s or 0.0))
    runs = Table(title="Runs of the fit", box=box.SIMPLE_HEAD)
    for col in ("run", "measured", "predicted before", "after", "residual"):
        runs.add_column(col, justify="left" if col == "run" else "right")
    for r in cal.runs:
        before = relative_error(r.predicted_before_s, r.measured_step_time_s)
        runs.add_row(
            r.name,
            ms(r.measured_step_time_s),
            f"{ms(r.predicted_before_s)} ({before:+.1%})",
            ms(r.predicted_after_s),
            f"{r.residual:+.1%}",
        )
    return Group(head, runs)
