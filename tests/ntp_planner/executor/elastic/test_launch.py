"""What every process of a live run shares (``live_config``) and how a run is judged
(``compare_live``) on a hand-made ``LiveRun`` of a one-rank model: the draws it feeds the
reference, step times from the commit times, planted errors in the losses and parameters found
at their size, a log that skips a sample failed in a sentence. Nothing is spawned."""

from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.elastic.faults import Fault  # noqa: E402
from ntp_planner.executor.elastic.launch import compare_live, live_config  # noqa: E402
from ntp_planner.executor.elastic.timeline import LiveRun  # noqa: E402
from ntp_planner.executor.spec import RunSpec, TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.runtime import reference_run  # noqa: E402


@dataclass(frozen=True)
class Shrunk:
    spec: RunSpec


def one_rank(**run) -> RunSpec:
    return make_spec(TinyConfig(), [[4, 4, 4, 4]], [([4], 2)], 1, 4, width=4, **run)  # TP1, 2 micro-batches


def test_live_config_is_what_every_process_shares():
    spec = one_rank(steps=5, dtype="float64")
    faults = [Fault(0, 2, "sync")]
    shrunk, cfg = live_config(Shrunk(spec), faults, 2, "", "gloo", 7.5)
    assert shrunk.spec == spec
    assert (cfg.base, cfg.steps, cfg.backend, cfg.timeout_s) == (spec, 5, "gloo", 7.5)
    assert (cfg.faults, cfg.checkpoint_every, cfg.checkpoint_dir) == ((Fault(0, 2, "sync"),), 2, "")


def test_live_config_refuses_half_precision_and_a_used_checkpoint_folder(tmp_path):
    with pytest.raises(ValueError) as err:
        live_config(Shrunk(one_rank(dtype="bfloat16")), (), 0, "", "gloo", 1.0)
    assert str(err.value) == "live recovery runs in float32 or float64, not bfloat16; use --dtype float32"
    live_config(Shrunk(one_rank()), (), 1, str(tmp_path), "gloo", 1.0)  # empty: fine
    (tmp_path / "step-00000003").mkdir()
    live_config(Shrunk(one_rank()), (), 1, str(tmp_path), "gloo", 1.0)  # no manifest: not complete, fine
    (tmp_path / "step-00000003" / "manifest.json").write_text("{}")
    with pytest.raises(ValueError) as err:
        live_config(Shrunk(one_rank()), (), 1, str(tmp_path), "gloo", 1.0)
    assert str(err.value) == f"checkpoint folder {tmp_path} already holds checkpoints; give an empty one"


SPEC = one_rank(steps=3, dtype="float64")
B = SPEC.total_sequences  # 2 sequences per step


@pytest.fixture(scope="module")
def reference():
    # three steps of B samples each, from sample 0 on, the last step's gradients: what the log below says
    return reference_run(SPEC, [(0, B), (B, B), (2 * B, B)], 2)


def log(consumed=(0, B, 2 * B)):
    times = (10.0, 10.5, 13.0)  # generation 0 commits steps 0 and 1, generation 1 step 2
    return [{"step": k, "generation": min(k // 2, 1), "consumed": c, "batch": B, "t": t, "loss": 0.0}
            for k, (c, t) in enumerate(zip(consumed, times, strict=True))]  # fmt: skip


def holders(ref, scale: dict):
    return [{"name": k, "rank": 0, "replica": 0, "stage": 0, "copy": 0, "tp_rank": 0, "index": [],
             "param": v * scale.get(k, 1.0), "grad": ref["grads"][k]} for k, v in ref["params"].items()]  # fmt: skip


def live(ref, steps, scale=None, loss_scale=1.0):
    for r, loss in zip(steps, ref["losses"], strict=True):
        r["loss"] = loss * loss_scale
    return LiveRun(steps, [], [], holders(ref, scale or {}), 2, 42.0, ["TP1", "TP1"], [B, B])


def test_a_run_equal_to_the_reference_errs_only_by_its_planted_errors(reference):
    got = compare_live(SPEC, live(reference, log(), {"layers.0.up": 1 + 1e-3}, 1 + 2e-3))
    assert got.problems == []
    assert got.max_rel_error_params == pytest.approx(1e-3, rel=1e-6) and got.worst_param.startswith("layers.0.up")
    assert got.max_rel_error_loss == pytest.approx(2e-3, rel=1e-6)
    assert got.max_rel_error_grads < 1e-15
    assert got.reference_losses == reference["losses"] and len(got.losses) == 3
    assert got.wall_s == 42.0
    assert got.step_time_s == 0.5  # the gap within generation 0; 10.5 -> 13.0 spans a recovery


def test_a_log_that_skips_a_sample_fails_in_a_sentence(reference):
    got = compare_live(SPEC, live(reference, log(consumed=(0, B + 1, 2 * B))))
    assert (
        got.problems[0]
        == f"step 1 committed samples {B + 1}..{2 * B}, but the stream continues at sample {B} with {B} samples"
    )
