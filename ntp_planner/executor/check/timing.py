"""Predicted against measured: the cost model's prediction of a run (``predict``) set against
what the run measured (``launch.Result``), as the plain dict `ntp validate --profile --json`
prints and ``cost_models.calibrate`` fits from. No torch; the rendering is ``views.timing``'s."""

from __future__ import annotations

from cost_models.profile import Profile


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: positive when the model is pessimistic."""
    return (predicted - measured) / measured


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
