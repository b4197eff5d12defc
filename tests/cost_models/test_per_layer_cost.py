"""Per-block degrees inside a stage: equivalences with uniform layouts and transition costs."""

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec, estimate_step
from cost_models.model import LayerKind, LayerOverride, ModelSpec
from cost_models.published import TABLE_A
from cost_models.step import CostEnv
from topologies import CLUSTERS, Cluster

H100 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=256)
MODEL = MODELS["llama3-8b"]
TRAIN = TrainingSpec(seq_len=4096, global_batch=256)
L = MODEL.num_layers


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, True), (4, True), (4, False)])
def test_all_blocks_at_t_equals_the_uniform_tp_t_layout(t, sp):
    """A stage of width 8 with every block at degree t is tp=t with 8/t times the replicas."""
    per_layer = ParallelLayout(
        tp=8,
        pp=2,
        dp=16,
        micro_batch=8,
        global_batch=256,
        layer_tp=(t,) * (L + 2),
        sequence_parallel=sp,
        distributed_optimizer=True,
    )
    uniform = ParallelLayout(
        tp=t,
        pp=2,
        dp=16 * 8 // t,
        micro_batch=t,
        global_batch=256,
        sequence_parallel=sp and t > 1,
        distributed_optimizer=True,
    )
    a, b = estimate_step(MODEL, TRAIN, per_layer, H100), estimate_step(MODEL, TRAIN, uniform, H100)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    assert a.memory_per_gpu_bytes == pytest.approx(b.memory_per_gpu_bytes, rel=1e-12)
    assert a.time_breakdown_s == pytest.approx(b.time_breakdown_s, rel=1e-12)


def test_transitions_are_free_under_sp_and_cost_an_all_gather_without():
    base = dict(tp=8, pp=1, dp=32, micro_batch=8, global_batch=256)
    env_sp = CostEnv(MODEL, TRAIN, ParallelLayout(**base, sequence_parallel=True), H100)
    env = CostEnv(MODEL, TRAIN, ParallelLayout(**base), H100)
    assert env_sp.transition_time(2, 8) == 0.0
    # 2 -> 8 without SP: each GPU gathers 4 shares of tokens * h * 2 bytes * 8/8 in total.
    nbytes = 2 * 8 * 4096 * 4096
    expected = 3 / 4 * nbytes / (450e9 * 0.8) + 2 * 1e-6  # 4-GPU ring on NVLink, tree latency 2 steps / 2
    assert env.transition_time(2, 8) == pytest.approx(expected)
    assert env.transition_time(8, 2) == env.transition_time(2, 8)


def test_mixed_degrees_cost_between_their_uniform_extremes():
    base = dict(tp=8, pp=1, dp=32, micro_batch=8, global_batch=256, sequence_parallel=True)
    mixed = estimate_step(MODEL, TRAIN, ParallelLayout(**base, layer_tp=(8,) + (2,) * 16 + (8,) * 16 + (8,)), H100)
    low = estimate_step(MODEL, TRAIN, ParallelLayout(**base, layer_tp=(2,) * (L + 2)), H100)
    high = estimate_step(MODEL, TRAIN, ParallelLayout(**base, layer_tp=(8,) * (L + 2)), H100)
    lo, hi = sorted((low.memory_per_gpu_bytes, high.memory_per_gpu_bytes))
    assert lo < mixed.memory_per_gpu_bytes < hi


def test_layer_tp_is_validated():
    with pytest.raises(ValueError, match="layer_tp has 3 entries but needs 34"):
        estimate_step(
            MODEL, TRAIN, ParallelLayout(tp=8, dp=32, global_batch=256, micro_batch=8, layer_tp=(8, 8, 8)), H100
        )
    with pytest.raises(ValueError, match=r"block 1 has degree 3, which does not divide the stage width tp\(8\)"):
        estimate_step(
            MODEL,
            TRAIN,
            ParallelLayout(tp=8, dp=32, global_batch=256, micro_batch=8, layer_tp=(8, 3) + (8,) * 32),
            H100,
        )


def test_heterogeneous_layers():
    pruned = MODEL.model_copy(
        update={
            "name": "pruned",
            "layer_overrides": (
                LayerOverride(layers=(3, 4), attention=False),
                LayerOverride(layers=(10,), ffn_hidden_size=4096),
            ),
        }
    )
    pruned = ModelSpec.model_validate(pruned.model_dump())
    assert pruned.layer_kind(3) == LayerKind(False, 14336, False)
    assert pruned.layer_kind(10) == LayerKind(False, 4096, True)
    assert pruned.kind_counts(0, 32) == {
        LayerKind(False, 14336, True): 29,
        LayerKind(False, 14336, False): 2,
        LayerKind(False, 4096, True): 1,
    }
    removed = 2 * (MODEL.attention_params + MODEL.hidden_size) + MODEL.mlp_params(14336) - MODEL.mlp_params(4096)
    assert MODEL.num_params - pruned.num_params == removed
    lay = ParallelLayout(tp=8, dp=32, global_batch=256, micro_batch=8, sequence_parallel=True)
    assert estimate_step(pruned, TRAIN, lay, H100).step_time_s < estimate_step(MODEL, TRAIN, lay, H100).step_time_s
    with pytest.raises(ValueError, match="outside 0..31"):
        ModelSpec.model_validate({**MODEL.model_dump(), "layer_overrides": [{"layers": [40], "attention": False}]})


def test_hardware_tflops_match_the_published_counting():
    # Table A's TFLOP/s count the recompute forward; ours must too, so measured time x ours ~ published.
    row = TABLE_A[-1]  # 1T: h 25600, 128 layers, s 2048, V 51200, batch 3072 on 3072 GPUs
    cost = estimate_step(row.model, row.training, row.layout, row.cluster)
    B, L, s, h, V = 3072, 128, 2048, 25600, 51200
    published = 96 * B * L * s * h * h * (1 + s / (6 * h) + V / (16 * h * L))  # Narayanan eq. with recompute
    assert cost.tflops_per_gpu * 1e12 * cost.step_time_s * 3072 == pytest.approx(published, rel=0.02)
