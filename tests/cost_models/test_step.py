"""The step estimator composes its terms consistently and responds to the layout as physics says."""

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec, estimate_step
from cost_models.efficiency import DEFAULT_EFFICIENCY
from cost_models.pipeline import pipeline_time
from topologies import CLUSTERS, Cluster

H100 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=1024)
TRAIN = TrainingSpec(seq_len=8192, global_batch=1024)
MODEL = MODELS["llama3-70b"]


def est(**kw):
    base = dict(tp=8, pp=4, dp=32, global_batch=1024, sequence_parallel=True, distributed_optimizer=True)
    return estimate_step(MODEL, TRAIN, ParallelLayout(**{**base, **kw}), H100)


def test_breakdowns_sum_to_totals():
    cost = est(vpp=2, recompute="selective")
    assert sum(cost.time_breakdown_s.values()) == pytest.approx(cost.step_time_s)
    assert sum(cost.memory_breakdown_bytes.values()) == pytest.approx(cost.memory_per_gpu_bytes)
    assert cost.tokens_per_s == pytest.approx(8192 * 1024 / cost.step_time_s)
    assert cost.mfu == pytest.approx(cost.model_flops_per_step / (cost.step_time_s * 1024 * 989.4e12))


def test_pipeline_closed_forms():
    assert pipeline_time([2.0] * 8, 32, 1).total_s == pytest.approx((32 + 7) * 2.0)
    assert pipeline_time([2.0] * 8, 32, 4).bubble_s == pytest.approx(7 * 2.0 / 4)
    uneven = pipeline_time([1.0, 3.0, 2.0], 10, 1)
    assert (uneven.bottleneck_stage, uneven.total_s) == (1, 10 * 3.0 + 3.0)


def test_bubble_matches_formula_inside_the_estimate():
    cost = est(vpp=1)
    t = cost.stage_time_s
    assert cost.time_breakdown_s["pp_bubble"] == pytest.approx(sum(t) - max(t))
    assert est(vpp=5).time_breakdown_s["pp_bubble"] < cost.time_breakdown_s["pp_bubble"] / 4


def test_recompute_trades_time_for_memory():
    none, sel, full = est(recompute="none"), est(recompute="selective"), est(recompute="full")
    assert (
        full.memory_breakdown_bytes["activations"]
        < sel.memory_breakdown_bytes["activations"]
        <= none.memory_breakdown_bytes["activations"]
    )
    assert full.step_time_s > sel.step_time_s >= none.step_time_s
    # Full recompute redoes every layer's forward: one third more layer compute.
    assert full.time_breakdown_s["recompute"] > 0.3 * full.time_breakdown_s["compute"]


def test_thin_tp_shards_run_further_from_peak():
    eff = DEFAULT_EFFICIENCY
    h, f, tokens = 8192, 28672, 8192
    wide = eff.shape_factor(tokens, f, h)  # MLP up-projection at tp1
    thin = eff.shape_factor(tokens, f // 64, h)  # the same GEMM split 64 ways
    assert thin < wide < 1.0


def test_distributed_optimizer_shards_adam_state():
    plain, sharded = est(distributed_optimizer=False), est(distributed_optimizer=True)
    assert sharded.memory_breakdown_bytes["optimizer"] == pytest.approx(plain.memory_breakdown_bytes["optimizer"] / 32)


def test_overlap_hides_dp_communication():
    exposed = est(overlap_grad_reduce=False).time_breakdown_s["dp_comm_exposed"]
    hidden = est(overlap_grad_reduce=True).time_breakdown_s["dp_comm_exposed"]
    assert exposed > 0 and hidden < exposed


def test_more_tp_means_less_memory_more_communication():
    tp4 = estimate_step(
        MODEL, TRAIN, ParallelLayout(tp=4, pp=4, dp=64, global_batch=1024, sequence_parallel=True), H100
    )
    tp8 = estimate_step(
        MODEL, TRAIN, ParallelLayout(tp=8, pp=4, dp=32, global_batch=1024, sequence_parallel=True), H100
    )
    assert tp8.memory_breakdown_bytes["weights"] == pytest.approx(tp4.memory_breakdown_bytes["weights"] / 2, rel=0.01)
    per_mb = lambda c, m: c.time_breakdown_s["tp_comm"] / m  # noqa: E731
    assert per_mb(tp8, 32) > per_mb(tp4, 16) / 2  # per micro-batch TP traffic does not halve


def test_moe_expert_parallelism_costs_all_to_all():
    mixtral = MODELS["mixtral-8x7b"]
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    t = TrainingSpec(seq_len=4096, global_batch=256)
    ep1 = estimate_step(mixtral, t, ParallelLayout(tp=2, dp=32, global_batch=256, sequence_parallel=True), c)
    ep8 = estimate_step(mixtral, t, ParallelLayout(tp=2, dp=32, ep=8, global_batch=256, sequence_parallel=True), c)
    assert ep1.time_breakdown_s["ep_comm"] == 0 < ep8.time_breakdown_s["ep_comm"]
    assert ep8.memory_breakdown_bytes["weights"] < ep1.memory_breakdown_bytes["weights"] / 4
