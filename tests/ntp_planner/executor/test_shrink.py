"""Shrinking a plan keeps its sharding structure (no torch needed)."""

import pytest

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.executor.ownership import layer_shards
from ntp_planner.executor.shrink import shrink
from ntp_planner.failures.replan import Replanner
from ntp_planner.solver.planner import plan_from_layout
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS


def per_layer_plan():
    """Llama-3-70B, tp8 pp2 dp2 with per-layer degrees 4 (embedding), 2/4/1 runs, 8 (LM head)."""
    layer_tp = (4,) + (2,) * 30 + (4,) * 10 + (1,) * 20 + (2,) * 20 + (8,)
    lay = ParallelLayout(tp=8, pp=2, dp=2, global_batch=64, micro_batch=8, layer_tp=layer_tp)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32)
    return plan_from_layout(MODELS["llama3-70b"], TrainingSpec(seq_len=2048, global_batch=64), cluster, lay)


def test_degrees_runs_heads_and_remainders_survive_the_shrink():
    plan = per_layer_plan()
    s = shrink(plan, nproc=32)
    spec = s.spec
    assert spec.world_size == 32 and s.stage_groups == ((0,), (1,)) and s.replicas == (0, 1)
    degrees = [[b.degree for b in st.blocks] for st in spec.replicas[0].stages]
    assert degrees == [[4, 2, 4], [1, 2, 8]]  # one layer per run of equal degrees, per stage
    cfg, model = spec.cfg, plan.model
    assert (cfg.heads, cfg.kv_heads) == (model.num_heads, model.num_kv_heads)
    for t in (1, 2, 4, 8):
        assert cfg.ffn % t == model.ffn_hidden_size % t and cfg.vocab % t == model.vocab_size % t
    assert spec.micro_batch == 8  # the degree-1 layer's 8 copies get one sequence each
    # process k stands for the plan rank of the same stage, replica and TP rank
    assert [r for r, _ in s.plan_ranks] == list(range(32)) and [g for _, g in s.plan_ranks] == plan.placement[:32]


def test_fewer_processes_merge_stages_then_drop_replicas():
    s = shrink(per_layer_plan(), nproc=16)
    assert s.spec.world_size == 16 and s.stage_groups == ((0,), (1,)) and s.replicas == (0,)
    s = shrink(per_layer_plan(), nproc=8)
    assert s.stage_groups == ((0, 1),) and [b.degree for b in s.spec.replicas[0].stages[0].blocks] == [4, 2, 4, 1, 2, 8]
    with pytest.raises(ValueError, match="needs 8 processes"):
        shrink(per_layer_plan(), nproc=7)


def test_a_replan_keeps_the_degraded_width_its_uneven_cut_and_fewer_micro_batches():
    lay = ParallelLayout(tp=8, dp=4, global_batch=64)
    plan = plan_from_layout(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=2048, global_batch=64),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32),
        lay,
    )
    replan = Replanner(plan).replan(frozenset({3}), "ntp")
    s = shrink(plan, nproc=16, replan=replan)
    widths = [rep.stages[0].width for rep in s.spec.replicas]
    assert widths == [8, 7]
    healthy, degraded = (rep.micro_batches for rep in s.spec.replicas)
    assert degraded < healthy
    cfg = s.spec.cfg
    model = plan.model
    assert (
        layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, 7).heads
        == layer_shards(model.num_heads, model.num_kv_heads, model.ffn_hidden_size, 7).heads
    )  # same heads per rank at TP7
    assert cfg.ffn % 7 == model.ffn_hidden_size % 7
    degraded_ranks = [gpu for (_, gpu), p in zip(s.plan_ranks, range(99), strict=False) if p >= 8]
    assert 3 not in degraded_ranks and None not in degraded_ranks


def test_context_parallelism_is_kept_when_it_fits_and_folded_otherwise():
    lay = ParallelLayout(tp=4, pp=2, dp=2, cp=2, global_batch=64, sequence_parallel=True)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32)
    plan = plan_from_layout(MODELS["llama3-8b"], TrainingSpec(seq_len=4096, global_batch=64), cluster, lay)
    kept = shrink(plan, nproc=16)
    assert kept.spec.cp == 2 and kept.spec.world_size == 16 and kept.stage_groups == ((0,), (1,))
    assert kept.spec.seq_len >= 2 * 4  # every rank of a cp chunk gets a token under sequence parallelism
    # processes run stage-major, then replica, then cp rank, then TP rank: the plan's rank order
    assert [r for r, _ in kept.plan_ranks] == [*range(8), *range(16, 24)]
    folded = shrink(plan, nproc=8)
    assert folded.spec.cp == 1 and folded.stage_groups == ((0,), (1,))
    assert any("cp 2 -> 1" in n for n in folded.spec.notes)


@pytest.mark.parametrize(
    ("name", "style"),
    [
        ("gpt3-5b", dict(norm="layer", mlp="gelu", bias=True, positions="learned")),
        ("nemotron4-15b", dict(norm="layer", mlp="relu2", bias=False, positions="rope")),
    ],
)
def test_a_gpt_or_nemotron_plan_keeps_its_blocks_and_selective_recompute(name, style):
    from ntp_planner.executor.predict import run_model

    lay = ParallelLayout(tp=4, pp=2, dp=2, global_batch=64, recompute="selective", sequence_parallel=True)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    plan = plan_from_layout(MODELS[name], TrainingSpec(seq_len=2048, global_batch=64), cluster, lay)
    spec = shrink(plan, nproc=16).spec
    cfg = spec.cfg
    assert {k: getattr(cfg, k) for k in style} == style and cfg.family == plan.model.family
    assert spec.recompute == "selective" and cfg.max_positions >= spec.seq_len
    not_executed = next((n for n in spec.notes if n.startswith("not executed")), "")
    assert "recompute" not in not_executed and "blocks" not in not_executed
    assert ("tied input and output embeddings" in not_executed) == plan.model.tie_embeddings
    shrunk = run_model(spec, name)  # what the cost model prices for the run: the same family
    assert (shrunk.family, shrunk.gated_mlp, shrunk.norm, shrunk.position, shrunk.bias) == (
        plan.model.family, False, "layernorm", style["positions"], style["bias"]
    )  # fmt: skip
