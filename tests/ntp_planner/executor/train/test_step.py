"""The one training step (``step.train_step``), in this process as a world of one (gloo,
FileStore): at every ZeRO level it equals the single-process reference, and a hook that raises
before the optimizer (the live worker's aborted vote) leaves parameters and AdamW state as they
were, so the next step continues as if the aborted one never ran."""

import inspect
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ntp_planner.executor.elastic import handover, worker
from ntp_planner.executor.model.batch import synthetic_batch
from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.parallel.comm import Comm
from ntp_planner.executor.spec import TinyConfig, make_spec
from ntp_planner.executor.train import runtime
from ntp_planner.executor.train.runtime import reference_run
from ntp_planner.executor.train.step import build, train_step

TOLERANCE = 1e-12  # float64, one rank: the same sums in the same order up to AdamW's rounding


@pytest.fixture
def one_rank(tmp_path):
    """A default process group of one rank, float64 by default; both undone afterwards."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    yield
    dist.destroy_process_group()
    torch.set_default_dtype(previous)


def _spec(zero: int, steps: int = 2):
    return make_spec(TinyConfig(), [[1, 1, 1, 1]], [([1], 2)], 2, 4, width=1, zero=zero, dtype="float64", steps=steps)


def _trainer(spec):
    return build(spec, 0, Comm(spec, 0, None, timedelta(seconds=30)), torch.device("cpu"))


def _params(tr) -> dict[str, torch.Tensor]:
    if tr.engine is not None:
        tr.engine.materialize()  # ZeRO-3: gathered from the shards
    return {name: t.detach().clone() for name, _, _, t in tr.model.named_parameters()}


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_steps_equal_the_reference_at_every_zero_level(one_rank, zero):
    spec = _spec(zero)
    tr = _trainer(spec)
    batch = synthetic_batch(spec)
    losses = [train_step(tr, batch) for _ in range(spec.steps)]
    ref = reference_run(spec)
    assert losses == pytest.approx(ref["losses"], rel=TOLERANCE)
    got = _params(tr)
    for name, want in ref["params"].items():
        assert torch.allclose(got[name], want, rtol=TOLERANCE, atol=0), name
    # the step changed the weights (a loop that skipped AdamW would fail the comparison above only
    # by lr-sized amounts: make sure they are well above the tolerance)
    start = {k: v.detach() for k, v in Reference(spec.cfg, seed=spec.seed).named_parameters()}
    assert max((got[k] - start[k]).abs().max().item() for k in start) > 1e-6


class Abort(Exception):
    pass


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_a_hook_that_raises_skips_the_optimizer(one_rank, zero):
    spec = _spec(zero)
    tr = _trainer(spec)
    batch = synthetic_batch(spec)
    train_step(tr, batch)
    before = handover.snapshot(tr)

    def abort(share):
        raise Abort

    with pytest.raises(Abort):
        train_step(tr, batch, abort)
    after = handover.snapshot(tr)
    kind = "rows" if zero == 0 else "flat"
    for name, s in before[kind].items():
        for k, v in s.items():
            assert torch.equal(after[kind][name][k], v), (name, k)
    train_step(tr, batch)  # the aborted step left no trace: two steps, as the reference's two
    got, ref = _params(tr), reference_run(spec)["params"]
    assert all(torch.allclose(got[k], ref[k], rtol=TOLERANCE, atol=0) for k in ref)


def test_no_loop_keeps_its_own_copy_of_the_step():
    for module in (runtime, worker):
        text = inspect.getsource(module)
        assert "one_f_one_b" not in text and "sync_gradients" not in text and "train_step(" in text
