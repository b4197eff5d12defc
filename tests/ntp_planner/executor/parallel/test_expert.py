"""One rank's expert-parallel MoE share (``expert``) against the one-process reference
(``model.moe.moe_reference``, float64): ep 1 forward and backward, the TP partials of the
experts' width summed, ep 2's all-to-all dispatch and combine on two forked gloo ranks,
``_local_experts`` on a hand-made counts matrix, the autograd pieces."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.model.activations import swiglu  # noqa: E402
from ntp_planner.executor.model.moe import local_experts, moe_keys, moe_reference  # noqa: E402
from ntp_planner.executor.model.reference import Reference  # noqa: E402
from ntp_planner.executor.parallel.comm import Comm  # noqa: E402
from ntp_planner.executor.parallel.expert import (  # noqa: E402
    AttachAux,
    ExpertPlace,
    ScaleGrad,
    _local_experts,
    rank_moe,
)
from ntp_planner.executor.parallel.tensor import rank_slice  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from tests.support.gloo_ranks import run_ranks  # noqa: E402

MOE = TinyConfig(layers=1, experts=4, top_k=2, expert_ffn=12, moe_layers=(0,), shared_ffn=8, aux_coeff=0.1)
BATCH, SEQ = 2, 5


@pytest.fixture
def f64():
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


def place(cfg=MOE) -> ExpertPlace:
    # one rank: every group has one member, so no collective reaches gloo (none is initialised)
    comm = Comm(make_spec(cfg, [[1, 1, 1]], [([1], 1)], 1, SEQ), 0)
    return ExpertPlace(cfg, comm, ep_ranks=(0,), ep_rank=0, cp_ranks=(0,), seq_len=SEQ)


def layer_and_input(seed=3):
    layer = Reference(MOE, seed=seed).layers[0]
    h = torch.randn(BATCH, SEQ, MOE.hidden, generator=torch.Generator().manual_seed(seed + 1))
    return layer, h


def test_ep1_forward_aux_and_backward_equal_the_reference(f64):
    layer, h0 = layer_and_input()
    keys = moe_keys(MOE)
    # the reference: its output, aux loss, and the gradients of (output . g) + aux
    h_ref = h0.clone().requires_grad_(True)
    y_ref, aux_ref = moe_reference(h_ref, layer, MOE)
    g = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(7))
    ((y_ref * g).sum() + aux_ref).backward()
    # the rank: the same parameters as fresh leaves; aux_scale 1 / tokens of the step makes its
    # aux piece aux_coeff x the mean of L_s, started by the output's backward
    p = {k: getattr(layer, k).detach().clone().requires_grad_(True) for k in keys}
    h = h0.clone().requires_grad_(True)
    sink: list = []
    y = rank_moe(h, h, p, place(), (0,), 1.0, 1.0 / (BATCH * SEQ), sink)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    assert sink == []  # the aux value is reported in backward
    (y * g).sum().backward()
    assert sink == [pytest.approx(aux_ref.item(), rel=1e-12)]
    assert 0.1 <= sink[0] <= 0.1 * MOE.experts  # aux_coeff x (1 balanced .. E all on one expert)
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-12, atol=1e-12)
    for k in keys:
        torch.testing.assert_close(p[k].grad, getattr(layer, k).grad, rtol=1e-12, atol=1e-12, msg=k)
        assert p[k].grad.abs().max() > 1e-6, k  # every piece learns, the router through aux too


@pytest.mark.parametrize("degree", [2, 3])
def test_tp_partials_of_the_experts_width_sum_to_the_reference(f64, degree):
    # expert_ffn 12 and shared_ffn 8 cut by width (12 -> 6/6 or 4/4/4; 8 -> 4/4 or 3/3/2): every
    # TP rank routes the same tokens, its outputs are partials whose sum is the layer's output
    layer, h = layer_and_input(seed=5)
    y_ref, _ = moe_reference(h, layer, MOE)
    parts, grads = [], {k: [] for k in moe_keys(MOE)}
    g = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(8))
    for j in range(degree):
        p = {k: rank_slice(getattr(layer, k), MOE, k, degree, j) for k in moe_keys(MOE)}
        y = rank_moe(h, h, p, place(), (0,), 1.0, 0.0)  # aux_scale 0: the output's gradient alone
        (y * g).sum().backward()
        parts.append(y.detach())
        for k in ("expert_gate", "expert_down", "shared_up"):
            grads[k].append(p[k].grad)
    torch.testing.assert_close(sum(parts), y_ref, rtol=1e-12, atol=1e-12)
    ((y_ref * g).sum()).backward()
    # the width slices' gradients, put side by side, are the reference's
    for k, dim in (("expert_gate", 1), ("expert_down", 2), ("shared_up", 0)):
        torch.testing.assert_close(torch.cat(grads[k], dim), getattr(layer, k).grad, rtol=1e-12, atol=1e-12, msg=k)


def test_local_experts_runs_each_row_through_its_expert_source_by_source(f64):
    # 2 sources x 2 owned experts, counts [[2, 1], [1, 3]]: rows come source 0's two for expert 0,
    # its one for expert 1, then source 1's one for expert 0 and three for expert 1
    expert_of_row = [0, 0, 1, 0, 1, 1, 1]
    gen = torch.Generator().manual_seed(2)
    p = {
        "expert_gate": torch.randn(2, 3, 4, generator=gen),
        "expert_up": torch.randn(2, 3, 4, generator=gen),
        "expert_down": torch.randn(2, 4, 3, generator=gen),
    }
    rows = torch.randn(7, 4, generator=gen)
    got = _local_experts(rows, torch.tensor([[2, 1], [1, 3]]), p)
    for i, e in enumerate(expert_of_row):
        want = swiglu(rows[i : i + 1], p["expert_gate"][e], p["expert_up"][e], p["expert_down"][e])
        torch.testing.assert_close(got[i : i + 1], want, rtol=1e-12, atol=1e-12, msg=f"row {i}")
    # sources that send an expert no rows
    got = _local_experts(rows[:3], torch.tensor([[0, 2], [1, 0]]), p)
    for i, e in enumerate([1, 1, 0]):
        want = swiglu(rows[i : i + 1], p["expert_gate"][e], p["expert_up"][e], p["expert_down"][e])
        torch.testing.assert_close(got[i : i + 1], want, rtol=1e-12, atol=1e-12, msg=f"row {i}")


def test_local_experts_are_contiguous_blocks():
    cfg = TinyConfig(layers=1, experts=8, top_k=2, expert_ffn=4, moe_layers=(0,))
    assert [local_experts(cfg, 4, r) for r in range(4)] == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    assert local_experts(cfg, 1, 0) == slice(0, 8)
    assert local_experts(cfg, 8, 5) == slice(5, 6)


def test_scale_grad_and_attach_aux_by_hand():
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    ScaleGrad.apply(x * 3, 0.25).sum().backward()
    assert x.grad.tolist() == [0.75, 0.75]
    # AttachAux: identity on y; its backward starts aux's with gradient 1 and reports aux's value
    y = torch.tensor([2.0, 3.0], requires_grad=True)
    w = torch.tensor(4.0, requires_grad=True)
    sink: list = []
    out = AttachAux.apply(y * 1, w * w, sink)
    assert out.tolist() == [2.0, 3.0]
    (out * torch.tensor([5.0, 7.0])).sum().backward()
    assert y.grad.tolist() == [5.0, 7.0] and w.grad.item() == 8.0 and sink == [16.0]


# ---- ep 2 on two forked gloo ranks -----------------------------------------------------------
EP2 = make_spec(MOE, [[1, 1, 1]], [([1], 1), ([1], 1)], BATCH, SEQ, dtype="float64", ep=2)


def ep2_inputs():
    """The layer, each rank's own batch and output gradient (float64, fixed seeds)."""
    torch.set_default_dtype(torch.float64)
    try:
        layer = Reference(MOE, seed=11).layers[0]
    finally:
        torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(12)
    hs = [torch.randn(BATCH, SEQ, MOE.hidden, generator=gen, dtype=torch.float64) for _ in range(2)]
    gs = [torch.randn(BATCH, SEQ, MOE.hidden, generator=gen, dtype=torch.float64) for _ in range(2)]
    return layer, hs, gs


def _ep2_rank(rank: int) -> dict:
    layer, hs, gs = ep2_inputs()
    mine = local_experts(MOE, 2, rank)  # experts 0-1 on rank 0, 2-3 on rank 1
    p = {k: getattr(layer, k).detach() for k in moe_keys(MOE)}
    p = {k: (t[mine] if k.startswith("expert_") else t).clone().requires_grad_(True) for k, t in p.items()}
    comm = Comm(EP2, rank)
    where = ExpertPlace(MOE, comm, ep_ranks=(0, 1), ep_rank=rank, cp_ranks=(rank,), seq_len=SEQ)
    h = hs[rank].clone().requires_grad_(True)
    sink: list = []
    y = rank_moe(h, h, p, where, (rank,), 1.0, 1.0 / (2 * BATCH * SEQ), sink)  # aux over both ranks' tokens
    (y * gs[rank]).sum().backward()
    return {"y": y.detach(), "h": h.grad, "aux": sink, "ep_s": comm.spent_s["ep"], **{k: p[k].grad for k in p}}


def test_ep2_dispatch_and_combine_equal_the_reference_over_both_batches(tmp_path):
    # each rank routes its own batch; an expert's owner gets every row routed to it (both ranks'),
    # so its gradient is the whole batch's; the router and shared expert hold each rank's part
    results = run_ranks(2, _ep2_rank, tmp_path)
    layer, hs, gs = ep2_inputs()
    h = torch.cat(hs).requires_grad_(True)
    y, aux = moe_reference(h, layer, MOE)  # one process, both batches, every expert
    ((y * torch.cat(gs)).sum() + aux).backward()
    for rank, got in enumerate(results):
        rows = slice(rank * BATCH, (rank + 1) * BATCH)
        torch.testing.assert_close(got["y"], y[rows].detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got["h"], h.grad[rows], rtol=1e-12, atol=1e-12)
        for k in ("expert_gate", "expert_up", "expert_down"):
            want = getattr(layer, k).grad[local_experts(MOE, 2, rank)]
            torch.testing.assert_close(got[k], want, rtol=1e-12, atol=1e-12, msg=f"rank {rank} {k}")
        assert got["ep_s"] > 0  # the counts and both rows' exchanges, forward and backward
    for k in ("router", "shared_gate", "shared_up", "shared_down"):  # summed later by the data sync
        torch.testing.assert_close(results[0][k] + results[1][k], getattr(layer, k).grad, rtol=1e-12, atol=1e-12)
    assert results[0]["aux"][0] + results[1]["aux"][0] == pytest.approx(aux.item(), rel=1e-12)
