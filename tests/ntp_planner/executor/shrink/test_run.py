"""Shrinking a plan keeps its sharding structure (no torch needed)."""

import pytest

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.executor.parallel.ownership import layer_shards
from ntp_planner.executor.shrink.run import shrink
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


def interleaved_plan(dp: int = 1):
    """A 16-layer Llama-3-8B at tp4 pp2 vpp2, chunks of 3/5/4/4 layers, per-layer degrees:
    embedding 4; chunk 0 (stage 0) 2 2 1; chunk 1 (stage 1) 4 x 5; chunk 2 (stage 0) 2 2 1 1;
    chunk 3 (stage 1) 1 x 4; LM head 4."""
    layer_tp = (4,) + (2, 2, 1) + (4,) * 5 + (2, 2, 1, 1) + (1,) * 4 + (4,)
    lay = ParallelLayout(tp=4, pp=2, vpp=2, dp=dp, global_batch=8 * dp, chunk_layers=(3, 5, 4, 4), layer_tp=layer_tp)
    model = MODELS["llama3-8b"].model_copy(update={"num_layers": 16})
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8 * dp)
    return plan_from_layout(model, TrainingSpec(seq_len=2048, global_batch=8 * dp), cluster, lay)


def test_cost_model_exporters_and_executor_read_one_chunk_mapping():
    from cost_models.pipeline_layout import parse_layout
    from cost_models.stage import stage_blocks
    from ntp_planner.emitters.common import pipeline_split

    plan = interleaved_plan()
    lay, L = plan.layout, plan.model.num_layers
    chunks = plan.pipeline
    assert [(c.stage, c.virtual_chunk, c.layers[0], len(c.layers)) for c in chunks] == [
        (0, 0, 0, 3), (1, 0, 3, 5), (0, 1, 8, 4), (1, 1, 12, 4),
    ]  # fmt: skip
    assert [c.tp for c in chunks] == [[4, 2, 2, 1], [4] * 5, [2, 2, 1, 1], [1, 1, 1, 1, 4]]
    # cost model: each stage runs its chunks' blocks (0 = embedding, i + 1 = layer i, L + 1 = head)
    for s in range(lay.pp):
        mine = [c for c in chunks if c.stage == s]
        held = [b for c in mine for b in ([0] * c.embedding + [i + 1 for i in c.layers] + [L + 1] * c.loss)]
        assert [i for i, _ in stage_blocks(plan.model, lay, s)] == held
        assert [lay.layer_tp[i] for i in held] == [t for c in mine for t in c.tp]
    # exporters: Megatron's layout string holds the same chunks
    split = pipeline_split(lay, L)
    assert split == {"pipeline_model_parallel_layout": "Ettt|ttttt|tttt|ttttL"}
    assert parse_layout(split["pipeline_model_parallel_layout"], pp=2) == tuple(len(c.layers) for c in chunks)
    # executor: the run keeps vpp 2, each chunk one layer per run of equal degrees, on stage c % 2
    spec = shrink(plan, nproc=8).spec
    assert spec.vpp == 2 and spec.pp == 2
    run = [[b.degree for b in c] for c in spec.replicas[0].model_chunks]
    assert run == [[4, 2, 1], [4, 4], [2, 1], [1, 1, 4]]
    assert [st.chunk_sizes for st in spec.replicas[0].stages] == [(3, 2), (2, 3)]
    assert spec.replicas[0].micro_batches % 2 == 0
    assert not any("vpp" in n for n in spec.notes if n.startswith("not executed"))
    assert any("vpp 2 kept: interleaved 1F1B over 4 chunks" in n for n in spec.notes)


def test_vpp_is_dropped_with_its_reason_when_one_stage_fits():
    spec = shrink(interleaved_plan(), nproc=4).spec
    assert spec.vpp == 1 and spec.pp == 1
    # one stage holds every chunk in model order, one layer per run of equal degrees (1 1 1 1 joins 1 1)
    assert [b.degree for b in spec.replicas[0].stages[0].blocks] == [4, 2, 1, 4, 2, 1, 4]
    assert any("vpp 2 (only one pipeline stage fits and interleaving needs two; plain 1F1B)" in n for n in spec.notes)


def test_a_replan_of_an_interleaved_plan_keeps_vpp_with_micro_batches_in_multiples_of_pp():
    plan = interleaved_plan(dp=2)
    replan = Replanner(plan).replan(frozenset({3}), "ntp")
    s = shrink(plan, nproc=16, replan=replan)
    assert s.spec.vpp == 2 and [[st.width for st in rep.stages] for rep in s.spec.replicas] == [[4, 4], [3, 3]]
    # the degraded replica's 5 of 8 micro-batches: 5/8 x 4 = 2.5 rounds to one group of pp = 2
    assert [rep.micro_batches for rep in s.spec.replicas] == [4, 2]


def test_the_prediction_of_an_interleaved_run_costs_its_chunks_in_model_order():
    from ntp_planner.executor.check.predict import _layout

    spec = shrink(interleaved_plan(), nproc=8).spec
    lay = _layout(spec, (4, 4), spec.replicas[0].micro_batches, 1, healthy=True)
    assert (lay.pp, lay.vpp, lay.chunk_layers) == (2, 2, (2, 2, 2, 2))
    assert lay.layer_tp == (4, 2, 1, 4, 4, 2, 1, 1, 1, 4)  # embedding, chunk 0, 1, 2, 3 layers, LM head


@pytest.mark.parametrize(
    ("name", "style"),
    [
        ("gpt3-5b", dict(norm="layer", mlp="gelu", bias=True, positions="learned")),
        ("nemotron4-15b", dict(norm="layer", mlp="relu2", bias=False, positions="rope")),
    ],
)
def test_a_gpt_or_nemotron_plan_keeps_its_blocks_and_selective_recompute(name, style):
    from ntp_planner.executor.check.predict import run_model

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


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_the_plans_zero_level_is_kept(zero):
    lay = ParallelLayout(tp=8, dp=4, global_batch=64, zero=zero, reshard_after_forward=zero != 3)
    plan = plan_from_layout(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=2048, global_batch=64),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32),
        lay,
    )
    s = shrink(plan, nproc=16)
    assert (s.spec.zero, s.spec.reshard_after_forward) == (zero, zero != 3)
    assert not [n for n in s.spec.notes if n.startswith("not executed") and "ZeRO" in n]  # nothing left out
    # three replicas when the processes allow: a ZeRO group of 3 pads the shards of every tensor
    # (their sizes are even), so the padding is exercised; 16 processes hold only two TP8 replicas
    assert len(s.spec.replicas) == 2 and "three (a ZeRO group) need more than 16 processes" in " ".join(s.spec.notes)
    wide = shrink(plan, nproc=24).spec
    assert len(wide.replicas) == 3 and wide.zero == zero
    assert wide.cfg.hidden % 3 and wide.cfg.vocab % 3  # the norms' and embedding columns' shards are padded
    if zero == 3:  # a re-plan's degraded replica runs at another degree: its gathers cannot pair up
        replanned = shrink(plan, nproc=16, replan=Replanner(plan).replan(frozenset({3}), "ntp"))
        assert replanned.spec.zero == 2
        notes = replanned.spec.notes
        assert any("ZeRO-3's per-micro-batch parameter gathers" in n and "run as ZeRO-2" in n for n in notes)
