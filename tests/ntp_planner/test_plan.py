"""Plan files: required keys, round trip, schema checks, atomic writes, placement."""

import json

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.rank_grid import RankGrid
from ntp_planner.plan import Plan, inputs_hash
from ntp_planner.solver.placement import place_ranks
from ntp_planner.solver.planner import make_plan, plan_from_layout
from topologies import CLUSTERS, Cluster


@pytest.fixture(scope="module")
def plan():
    return make_plan(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=4096, global_batch=64),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32),
        top=3,
    )


def test_plan_json_has_the_promised_keys(plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    assert {
        "tp",
        "pp",
        "dp",
        "cp",
        "ep",
        "micro_batch",
        "global_batch",
        "vpp",
        "recompute",
        "sequence_parallel",
    } <= set(data["layout"])
    assert {"step_time_s", "mfu", "mfu_causal", "tokens_per_s", "memory_per_gpu_bytes"} <= set(data["predicted"])
    assert data["schema_version"] == 2 and len(data["inputs_hash"]) == 64
    # where every layer lives: every layer in exactly one chunk, chunk c on stage c % pp
    layers = [i for c in data["pipeline"] for i in c["layers"]]
    assert layers == list(range(plan.model.num_layers))
    assert all(c["stage"] == c["chunk"] % plan.layout.pp for c in data["pipeline"])
    assert data["pipeline"][0]["embedding"] and data["pipeline"][-1]["loss"]
    assert len(data["runners_up"]) == 2
    assert Plan.load(path) == plan


def test_hash_changes_with_inputs(plan):
    other = make_plan(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=4096, global_batch=128),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32),
        top=1,
    )
    assert other.inputs_hash != plan.inputs_hash


def test_plans_older_than_gpus_per_domain_still_load(plan, tmp_path):
    path = tmp_path / "old.json"
    data = json.loads(plan.model_dump_json())
    del data["cluster"]["gpus_per_domain"]
    path.write_text(json.dumps(data))
    old = Plan.load(path)
    assert old.cluster.gpus_per_domain is None and old.cluster.build().used_per_domain == 8
    assert old.inputs_hash == plan.inputs_hash  # unset, the field leaves the hash as it was
    partial = plan.cluster.model_copy(update={"gpus_per_domain": 8})
    assert inputs_hash(plan.model, plan.training, partial) != plan.inputs_hash


def test_schema_and_garbage_are_rejected(plan, tmp_path):
    path = tmp_path / "p.json"
    data = json.loads(plan.model_dump_json())
    path.write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(ValueError, match="schema version 99, this ntp reads version 2"):
        Plan.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Plan.load(path)
    path.write_text(json.dumps({**data, "layout": {**data["layout"], "tp": "eight"}}))
    with pytest.raises(ValueError, match="layout.tp"):
        Plan.load(path)


def test_saved_plan_has_ordinary_permissions(plan, tmp_path):
    import os

    path = tmp_path / "plan.json"
    plan.save(path)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_write_keeps_the_old_file_on_failure(plan, tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    path.write_text("old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        plan.save(path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temp file left behind


def check_placement(ranks, world, tp, pp, cluster):
    assert len(ranks) == world and len(set(ranks)) == world  # a bijection onto its image...
    assert not set(ranks) & cluster.failed_gpus  # ...of healthy GPUs only
    for g in range(0, world, tp):  # every TP group inside one NVLink domain
        assert len({cluster.domain_of(x) for x in ranks[g : g + tp]}) == 1
    stride = world // pp
    for r in range(world - stride):  # pipeline neighbours on the same rail
        assert cluster.rail_of(ranks[r]) == cluster.rail_of(ranks[r + stride])


@pytest.mark.parametrize(
    ("name", "gpus", "tp", "pp", "failed", "per_domain"),
    [
        ("dgx-h100", 64, 8, 2, {1, 37, 60}, None),
        ("dgx-h100", 64, 2, 4, {3, 17, 18, 40}, None),
        ("dgx-h100", 64, 4, 2, set(), None),
        ("gb200-nvl72", 144, 8, 2, {1, 77, 100}, None),
        ("gb200-nvl72", 144, 36, 2, set(), None),
        ("gb200-nvl72", 288, 4, 4, {0, 5, 150, 151, 287}, None),
        ("gb200-nvl72", 128, 8, 2, {1, 77, 100}, None),  # domains of 72 and 56
        ("gb200-nvl72", 128, 16, 2, {1, 77, 100}, 64),
        ("gb200-nvl72", 256, 32, 2, set(), 64),
    ],
)
def test_placement_rules(name, gpus, tp, pp, failed, per_domain):
    cluster = Cluster(spec=CLUSTERS[name], num_gpus=gpus, gpus_per_domain=per_domain, failed_gpus=frozenset(failed))
    size = per_domain or cluster.spec.domain_size
    slots = sum(
        all(g not in failed for g in range(s, s + tp))
        for d in range(cluster.num_domains)
        for s in range(d * size, min((d + 1) * size, gpus) - tp + 1, tp)
    )
    world = slots * tp // 2  # half the healthy slots leave room for the same-rail rule
    world -= world % (tp * pp)
    ranks = place_ranks(RankGrid(tp=tp, dp=world // (tp * pp), pp=pp), cluster)
    check_placement(ranks, world, tp, pp, cluster)
    if not failed:
        assert ranks == list(range(world))


def test_placement_skips_the_tail_of_a_partial_domain():
    """128 GPUs of gb200-nvl72 are domains of 72 and 56: TP16 slots start at 0, 16, 32, 48 and at
    72, 88, 104; GPUs 64-71 and 120-127 hold no whole slot."""
    cluster = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128)
    assert place_ranks(RankGrid(tp=16, dp=7), cluster) == [*range(64), *range(72, 120)]
    with pytest.raises(ValueError, match="only 7 TP groups of 16 healthy GPUs"):
        place_ranks(RankGrid(tp=16, dp=8), cluster)


def test_placement_reports_shortage():
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16, failed_gpus=frozenset({0, 8}))
    with pytest.raises(ValueError, match="only 0 TP groups of 8 healthy GPUs"):
        place_ranks(RankGrid(tp=8, dp=2), cluster)


def test_user_layout_plan():
    layout = ParallelLayout(tp=4, pp=2, dp=4, global_batch=64, sequence_parallel=True)
    p = plan_from_layout(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=4096, global_batch=64),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32),
        layout,
    )
    assert p.source == "user" and p.layout == layout and p.placement == list(range(32))
