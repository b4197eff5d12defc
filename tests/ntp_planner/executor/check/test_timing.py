"""The comparison of a prediction with a run's measurement, pinned to hand-made numbers."""

from types import SimpleNamespace

import pytest

from ntp_planner.executor.check.timing import comparison_json, measured_step, relative_error


def test_relative_error_is_positive_when_the_model_is_pessimistic():
    assert relative_error(1.2, 1.0) == pytest.approx(0.2)
    assert relative_error(0.9, 1.2) == pytest.approx(-0.25)


def test_a_measured_run_set_against_its_prediction():
    result = SimpleNamespace(
        step_time_median_s=0.5,
        time_split_s={"compute": 0.3, "tp_comm": 0.1},
        stage_time_split_s=[{"compute": 0.3, "tp_comm": 0.1}, {"compute": 0.2, "tp_comm": 0.05}],
        stage_memory_bytes=[{"weights": 1, "grads": 2, "optimizer": 3, "activations_peak": 4, "other": 9}] * 2,
    )
    measured = measured_step(result)
    assert measured["stage_busy_s"] == pytest.approx([0.4, 0.25])  # compute + TP per stage
    assert measured["stage_memory_bytes"][0] == {"weights": 1, "grads": 2, "optimizer": 3, "activations": 4}
    prediction = SimpleNamespace(
        step_time_s=0.6,
        time_split_s={"compute": 0.35, "dp_sync": 0.05},
        stage_busy_s=[0.45, 0.3],
        memory_bytes=[{"weights": 1}, {"weights": 2}],
        notes=("a note",),
    )
    data = comparison_json(prediction, measured)
    assert data["step_time_error"] == pytest.approx(0.2)
    assert data["time_split_s"]["dp_sync"] == {"predicted": 0.05, "measured": 0.0}  # the run measured none
    assert data["stages"][1]["measured_busy_s"] == pytest.approx(0.25)
    assert data["prediction_notes"] == ["a note"]
