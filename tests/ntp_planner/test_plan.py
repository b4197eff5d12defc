"""Plan files: required keys, round trip, schema checks, atomic writes, placement."""

import json

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.placement import place_ranks
from ntp_planner.plan import Plan
from ntp_planner.planner import make_plan, plan_from_layout
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
    assert {"step_time_s", "mfu", "tokens_per_s", "memory_per_gpu_bytes"} <= set(data["predicted"])
    assert data["schema_version"] == 1 and len(data["inputs_hash"]) == 64
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


def test_schema_and_garbage_are_rejected(plan, tmp_path):
    path = tmp_path / "p.json"
    data = json.loads(plan.model_dump_json())
    path.write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(ValueError, match="schema version 99, this ntp reads version 1"):
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


@pytest.mark.parametrize(
    ("name", "gpus", "tp"), [("dgx-h100", 64, 8), ("gb200-nvl72", 144, 8), ("gb200-nvl72", 144, 36)]
)
def test_placement_keeps_tp_groups_in_domains_and_avoids_failures(name, gpus, tp):
    failed = frozenset({1, 37, 60})
    cluster = Cluster(spec=CLUSTERS[name], num_gpus=gpus, failed_gpus=failed)
    size = cluster.spec.domain_size
    groups = sum(
        len([g for g in range(d * size, (d + 1) * size) if g not in failed]) // tp for d in range(cluster.num_domains)
    )
    world = groups * tp
    ranks = place_ranks(world, tp, cluster)
    assert len(set(ranks)) == len(ranks) == world
    assert not failed & set(ranks)
    for g in range(0, world, tp):
        assert len({cluster.domain_of(x) for x in ranks[g : g + tp]}) == 1


def test_placement_reports_shortage():
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16, failed_gpus=frozenset({0, 8}))
    with pytest.raises(ValueError, match="only 0 TP groups of 8 healthy GPUs"):
        place_ranks(16, 8, cluster)


def test_user_layout_plan():
    layout = ParallelLayout(tp=4, pp=2, dp=4, global_batch=64, sequence_parallel=True)
    p = plan_from_layout(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=4096, global_batch=64),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32),
        layout,
    )
    assert p.source == "user" and p.layout == layout and p.placement == list(range(32))
