"""Predicted against measured: the comparison `ntp validate --profile` prints and `ntp calibrate`'s
fit. Rich renderables and plain dicts; nothing here prints or imports torch."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from cost_models.profile import Profile

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


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: positive when the model is pessimistic."""
    return (predicted - measured) / measured


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def kib(nbytes: float) -> str:
    return f"{nbytes / 1024:,.1f} KiB"


def measured_step(result) -> dict:
    """What a run measured (``executor.launch.Result``), in the shape ``comparison_json`` reads:
    the slowest rank's median steady step, its split, each stage's compute + TP time and memory."""
    memory = [
        {
            "weights": m["weights"],
            "grads": m["grads"],
            "optimizer": m["optimizer"],
            "activations": m["activations_peak"],
        }  # noqa: E501
        for m in result.stage_memory_bytes
    ]
    return {
        "step_time_s": result.step_time_median_s,
        "time_split_s": result.time_split_s,
        "stage_busy_s": [s["compute"] + s["tp_comm"] for s in result.stage_time_split_s],
        "stage_memory_bytes": memory,
    }


def comparison_json(prediction, measured: dict) -> dict:
    """``measured``: ``measured_step(result)``. Keys with units, as `--json` prints them."""
    error = relative_error(prediction.step_time_s, measured["step_time_s"])
    return {
        "predicted_step_time_s": prediction.step_time_s,
        "measured_step_time_s": measured["step_time_s"],
        "step_time_error": error,
        "time_split_s": {
            k: {"predicted": v, "measured": measured["time_split_s"].get(k, 0.0)}
            for k, v in prediction.time_split_s.items()
        },
        "stages": [
            {
                "stage": i,
                "predicted_busy_s": busy,
                "measured_busy_s": measured["stage_busy_s"][i],
                "predicted_memory_bytes": prediction.memory_bytes[i],
                "measured_memory_bytes": measured["stage_memory_bytes"][i],
            }
            for i, busy in enumerate(prediction.stage_busy_s)
        ],
        "prediction_notes": list(prediction.notes),
    }


def compare_run(profile: Profile, cluster, spec, model_name: str, result) -> dict:
    """The cost model's prediction of ``spec`` (``executor.predict``) against what the run
    measured (``result``: ``executor.launch.Result``), as ``comparison_json``, with the
    prediction's compute / communication / overhead parts that ``run_record`` stores."""
    from ntp_planner.executor.check.predict import predict_run

    prediction = predict_run(spec, model_name, profile, cluster)
    data = comparison_json(prediction, measured_step(result))
    data["prediction_parts_s"] = {
        "compute": prediction.compute_s,
        "comm": prediction.comm_s,
        "overhead": prediction.overhead_s,
    }
    return data


def run_record(name: str, profile: Profile, comparison: dict):
    """The ``cost_models.calibrate.RunRecord`` of one compared run."""
    from cost_models.calibrate import RunRecord

    parts = comparison["prediction_parts_s"]
    return RunRecord(
        name=name,
        profile_created=profile.created,
        profile_gpu=profile.device.gpu,
        measured_step_time_s=comparison["measured_step_time_s"],
        predicted_step_time_s=comparison["predicted_step_time_s"],
        compute_s=parts["compute"],
        comm_s=parts["comm"],
        overhead_s=parts["overhead"],
        compute_scale=profile.calibration.compute_scale,
        comm_scale=profile.calibration.comm_scale,
    )


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
