"""Rank arithmetic of a run, without torch: groups, copies, validation."""

import pytest

from ntp_planner.executor.groups import dp_groups, process_groups
from ntp_planner.executor.spec import (
    Block,
    ReplicaSpec,
    RunSpec,
    StageSpec,
    TinyConfig,
    make_spec,
)


def test_groups_of_a_per_layer_stage_and_two_uniform_replicas():
    spec = make_spec(TinyConfig(layers=2), [[4, 1, 2, 4]], [([4], 1), ([4], 1)], 4, 8)
    groups = process_groups(spec)
    assert len(groups) == len(set(groups))  # deduplicated: created once each
    # replica 0: whole stage, degree 1 (4 copies of 1 rank: TP groups of one, one in-stage DP group of 4),
    # degree 2 (TP {0,1} {2,3}; in-stage DP {0,2} {1,3}), degree 4 (TP = stage; DP groups of one)
    assert groups[:4] == [(0, 1, 2, 3), (0,), (1,), (2,)]
    assert {(0, 1), (2, 3), (0, 2), (1, 3)} <= set(groups)
    # across replicas, every block at one degree: TP rank j of every copy of both replicas
    assert dp_groups(spec, 0, 1) == ((0, 1, 2, 3, 4, 5, 6, 7),)  # degree 1: all 8 copies hold the whole layer
    assert dp_groups(spec, 0, 2) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert dp_groups(spec, 0, 0) == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_ntp_groups_pair_core_ranks_of_copy_zero():
    # healthy stage width 4 with a layer at degree 2; the degraded replica runs everything at 3
    spec = make_spec(TinyConfig(layers=2), [[4, 2, 4, 4]], [([4], 2), ([3], 1)], 2, 8, width=4)
    assert [b.degree for b in spec.replicas[1].stages[0].blocks] == [3, 3, 3, 3]
    assert dp_groups(spec, 0, 1) == ((0, 4), (1, 5))  # n = 2: core ranks of copy 0
    assert dp_groups(spec, 0, 0) == ((0, 4), (1, 5), (2, 6))  # 4 vs 3: n = 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(stage_degrees=[[3, 3, 3, 3]], replicas=[([4], 1)]), "degree 3 does not divide the stage width 4"),
        (dict(stage_degrees=[[4, 1, 4, 4]], replicas=[([4], 1)], micro_batch=2), r"micro_batch\(2\) is not divisible"),
        (dict(stage_degrees=[[4, 4, 4]], replicas=[([4], 1)]), "layers 0..1"),
        (dict(stage_degrees=[[4, 4, 4, 4]], replicas=[([4], 0)]), "needs at least 1"),
    ],
)
def test_impossible_runs_say_why(kwargs, message):
    args = {"micro_batch": 4, "seq_len": 8} | kwargs
    with pytest.raises(ValueError, match=message):
        make_spec(
            TinyConfig(layers=2), args["stage_degrees"], args["replicas"], args["micro_batch"], args["seq_len"], width=4
        )


def test_replicas_must_hold_the_same_blocks():
    cfg = TinyConfig(layers=1)
    a = make_spec(cfg, [[2, 2, 2]], [([2], 1)], 2, 4).replicas[0]
    b = make_spec(cfg, [[2, 2], [2]], [([2, 2], 1)], 2, 4).replicas[0]
    moved = type(b)(tuple(type(s)(tuple(r + 2 for r in s.ranks), s.blocks) for s in b.stages), 1)
    with pytest.raises(ValueError, match="same blocks on the same stages"):
        RunSpec(cfg, (a, moved), 2, 4)
    assert Block("layer", 3, 2).name == "layers.3"


def test_interleaved_chunks_sit_on_stage_c_mod_pp_in_model_order():
    # 4 chunks over 2 stages: stage 0 holds chunks 0 and 2, stage 1 chunks 1 and 3
    spec = make_spec(TinyConfig(layers=5), [[2, 2, 2], [2], [2], [2, 2]], [([2, 2], 2)], 2, 8, vpp=2)
    stages = spec.replicas[0].stages
    assert [[b.name for b in c] for c in stages[0].chunks] == [["embed", "layers.0", "layers.1"], ["layers.3"]]
    assert [[b.name for b in c] for c in stages[1].chunks] == [["layers.2"], ["layers.4", "head"]]
    # the flat block list keeps every block of the stage, so the gradient sync by stage block still works
    assert [b.name for b in stages[1].blocks] == ["layers.2", "layers.4", "head"]
    swapped = type(stages[0])(stages[0].ranks, stages[0].blocks, (1, 3))  # chunk 0 would end at the embedding
    with pytest.raises(ValueError, match=r"chunks \(chunk c on stage c % pp as virtual chunk c // pp\) must hold"):
        RunSpec(spec.cfg, (type(spec.replicas[0])((swapped, stages[1]), 2),), 2, 8, vpp=2)
    with pytest.raises(ValueError, match=r"stage 0 holds 4 blocks in chunks of \[4\]; vpp 2 needs 2 chunks"):
        RunSpec(spec.cfg, (type(spec.replicas[0])((type(stages[0])(stages[0].ranks, stages[0].blocks), stages[1]), 2),),
                2, 8, vpp=2)  # fmt: skip


def test_interleaving_refuses_micro_batches_that_are_not_a_multiple_of_pp():
    # Megatron-Core: groups of pp micro-batches per chunk, the last group full or at least pp long
    with pytest.raises(ValueError) as err:
        make_spec(TinyConfig(layers=5), [[2, 2, 2], [2], [2], [2, 2]], [([2, 2], 3)], 2, 8, vpp=2)
    assert str(err.value) == (
        "replica 0 runs 3 micro-batches but the interleaved schedule (vpp 2) needs a multiple of pp: 3 % 2 = 1"
    )
    with pytest.raises(ValueError, match=r"interleaving \(vpp 2\) needs .* at least 2 stages"):
        make_spec(TinyConfig(layers=2), [[2, 2], [2, 2]], [([2], 2)], 2, 8, vpp=2)


def test_recompute_granularity_and_learned_positions_are_checked():
    with pytest.raises(ValueError, match="recompute must be 'none', 'selective' or 'full'; got True"):
        make_spec(TinyConfig(), [[2, 2, 2, 2]], [([2], 1)], 1, 8, recompute=True)
    learned = TinyConfig(positions="learned", max_positions=8)
    assert make_spec(learned, [[2, 2, 2, 2]], [([2], 1)], 1, 8).cfg.max_positions == 8
    with pytest.raises(ValueError, match="sequence of 9 tokens is longer than the 8 learned positions"):
        make_spec(learned, [[2, 2, 2, 2]], [([2], 1)], 1, 9)


def test_the_family_of_a_config_follows_its_mlp():
    assert [TinyConfig(mlp=m).family for m in ("swiglu", "gelu", "relu2")] == ["llama", "gpt", "nemotron"]


def _spec(**changes):
    """A valid two-stage run with ``changes`` to the RunSpec or, under ``cfg``, to its TinyConfig."""
    from dataclasses import replace

    spec = make_spec(TinyConfig(layers=2), [[2, 2], [2, 2]], [([2, 2], 1)], 2, 8)
    cfg = replace(spec.cfg, **changes.pop("cfg", {}))
    return replace(spec, cfg=cfg, **changes)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(replicas=()), "at least one replica of at least one stage; got 0"),
        (dict(micro_batch=0), r"micro_batch\(0\) and steps\(3\) must be at least 1"),
        (dict(steps=0), r"micro_batch\(2\) and steps\(0\) must be at least 1"),
        (dict(cfg=dict(heads=3)), r"hidden\(32\) % heads\(3\) = 2"),
        (dict(cfg=dict(kv_heads=3)), r"heads\(8\) % kv_heads\(3\) = 2"),
        (dict(cfg=dict(kv_heads=0)), r"kv_heads\(0\).* must be at least 1"),
        (dict(cfg=dict(hidden=24)), "head_dim 3 is odd"),
        (dict(cfg=dict(norm="batch")), "norm must be one of rms, layer; got 'batch'"),
        (dict(cfg=dict(mlp="silu")), "mlp must be one of swiglu, gelu, relu2"),
        (dict(cfg=dict(positions="alibi")), "positions must be one of rope, learned"),
        (dict(cfg=dict(vocab=1)), r"degree 2 exceeds the model's heads\(8\), ffn\(48\) or vocab\(1\)"),
    ],
)
def test_malformed_runs_are_one_line_value_errors(changes, message):
    # each of these used to pass ``check`` and then raise IndexError / ZeroDivisionError / KeyError
    # in the run, run silently as another model (an unknown norm as RMSNorm), or blame the heads
    with pytest.raises(ValueError, match=message):
        _spec(**changes)


def test_a_stage_without_ranks_or_a_block_at_degree_zero_is_refused():
    cfg = TinyConfig(layers=1)
    blocks = (Block("embed", -1, 1), Block("layer", 0, 0), Block("head", -1, 1))
    with pytest.raises(ValueError, match=r"replica 0 stage 0 has 1 ranks and blocks at degree < 1: \['layers.0'\]"):
        RunSpec(cfg, (ReplicaSpec((StageSpec((0,), blocks),), 1),), 1, 4)
    with pytest.raises(ValueError, match="at least one replica of at least one stage"):
        RunSpec(cfg, (ReplicaSpec((), 1),), 1, 4)
