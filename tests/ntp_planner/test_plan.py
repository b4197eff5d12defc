"""Plan files: required keys, round trip, schema checks, atomic writes, placement."""

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.rank_grid import RankGrid
from ntp_planner.plan import Plan, inputs_hash
from ntp_planner.solver.placement import place_ranks
from ntp_planner.solver.planner import make_plan, plan_from_layout
from topologies import CLUSTERS, Cluster, InputError


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
    assert inputs_hash(plan.model, plan.training, partial, plan.layout) != plan.inputs_hash


def test_schema_and_garbage_are_rejected(plan, tmp_path):
    path = tmp_path / "p.json"
    data = json.loads(plan.model_dump_json())
    path.write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(ValueError, match="has schema version 99; this ntp reads version 2: re-plan it"):
        Plan.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Plan.load(path)
    path.write_text(json.dumps({**data, "layout": {**data["layout"], "tp": "eight"}}))
    with pytest.raises(InputError, match="layout.tp"):
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


# ---- an inconsistent plan fails on load, in one sentence ----------------------------------
@pytest.fixture(scope="module")
def small():
    """llama3-8b on 16 GPUs, tp4 dp2 pp2, with a Megatron runner-up to edit."""
    layout = ParallelLayout(tp=4, pp=2, dp=2, global_batch=64)
    p = plan_from_layout(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=4096, global_batch=64),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16),
        layout,
    )
    runner = {k: getattr(p.predicted, k) for k in ("step_time_s", "mfu", "tokens_per_s", "memory_per_gpu_bytes")}
    return json.loads(p.model_dump_json()) | {
        "megatron": {"layout": p.layout.model_dump(), **runner, "time_breakdown_s": {}}
    }


def _edited(data, path, value):
    """A deep copy of ``data`` with the item at ``path`` (keys and indices) set, or deleted if ``value`` is DELETE."""
    data = json.loads(json.dumps(data))
    *parents, last = path
    node = data
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


DELETE = object()
INCONSISTENT = [
    (("layout", "dp"), 4, "layout tp(4) * cp(1) * dp(4) * pp(2) = 32 != cluster.num_gpus(16); the degrees must"),
    (("placement", 1), 0, "placement puts two ranks on GPU(s) [0]"),
    (("placement", 15), 16, "placement names GPU(s) [16] outside 0..15"),
    (("placement", 15), -1, "placement names GPU(s) [-1] outside 0..15"),
    (("placement", 15), DELETE, "placement lists 15 GPUs but the layout has 16 ranks"),
    (("cluster", "failed_gpus"), [3], "placement puts ranks on failed GPU(s) [3]"),
    (("per_layer_tp", 33), DELETE, "per_layer_tp has 33 entries but needs 34 (embedding, 32 layers, LM head)"),
    (("per_layer_tp", 5), 0, "per_layer_tp gives block 5 degree 0 but the layout runs it at 4"),
    (("layout", "layer_tp"), [4] * 33, "layer_tp has 33 entries but needs 34"),
    (("layout", "layer_tp"), [4] * 5 + [3] + [4] * 28, "layer_tp: block 5 has degree 3, which does not divide"),
    (("layout", "global_batch"), 32, "layout global_batch(32) != training global_batch(64)"),
    (("predicted", "step_time_s"), 0, "predicted.step_time_s is 0; it must be a finite number above 0"),
    (("predicted", "step_time_s"), -1.5, "predicted.step_time_s is -1.5"),
    (("predicted", "step_time_s"), float("nan"), "predicted.step_time_s is nan"),
    (("predicted", "step_time_s"), float("inf"), "predicted.step_time_s is inf"),
    (("predicted", "memory_per_gpu_bytes"), float("nan"), "predicted.memory_per_gpu_bytes is nan"),
    (("predicted", "mfu"), float("inf"), "predicted.mfu is inf; it must be a fraction in (0, 1]"),
    (("megatron", "step_time_s"), 0, "megatron.step_time_s: 0 must be a finite number above 0"),
    (("megatron", "step_time_s"), float("nan"), "megatron.step_time_s: Input should be a finite number"),
    (("headroom",), 1.5, "headroom: 1.5 must lie in [0, 1)"),
    (("schema_version",), "2", "this plan has schema version '2'; this ntp reads version 2: re-plan it"),
    (("schema_version",), 1, "this plan has schema version 1; this ntp reads version 2: re-plan it"),
    (("schema_version",), DELETE, "is not a plan file (no schema_version)"),
    (("cluster", "num_gpus"), 10**30, "cluster: num_gpus: must lie in 1..1,000,000 GPUs, not 1e+30"),
    (("cluster", "spec", "nvlink_bw_bytes_per_s"), 1e-300, "nvlink_bw_bytes_per_s: must lie in 1e+08..1e+14"),
    (("training", "global_batch"), 10**30, "training.global_batch: must lie in 1..10,000,000 sequences"),
    (("model", "num_layers"), 10**30, "model.num_layers: must lie in 1..10,000 layers"),
    (("pipeline", 0, "stage"), 1, "pipeline does not match the layout's chunks and degrees"),
]


@pytest.mark.parametrize(("path", "value", "message"), INCONSISTENT)
def test_inconsistent_plans_fail_on_load(small, tmp_path, path, value, message):
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(_edited(small, path, value)))
    with pytest.raises(InputError) as err:
        Plan.load(file)
    text = str(err.value)
    assert "\n" not in text and str(file) in text and message in text, text
    assert "--" not in text and "ntp plan" not in text  # library terms, no CLI flags


EDITED_INPUTS = [
    (("model", "hidden_size"), 8192),
    (("model", "vocab_size"), 32000),
    (("training", "seq_len"), 8192),
    (("training", "fp8_recipe"), "current"),
    (("cluster", "spec", "nvlink_bw_bytes_per_s"), 9e11),
    (("layout", "recompute"), "full"),
    (("layout", "sequence_parallel"), True),
]


@pytest.mark.parametrize(("path", "value"), EDITED_INPUTS)
def test_a_plan_whose_inputs_were_edited_is_refused(small, tmp_path, path, value):
    """The prediction belongs to the inputs it was computed from: an input or layout edited by
    hand (and still consistent) changes the hash, and the plan says so instead of being explained,
    re-planned or exported under its old prediction."""
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(_edited(small, path, value)))
    with pytest.raises(InputError) as err:
        Plan.load(file)
    text = str(err.value)
    assert text.startswith(f"{file} was edited after it was predicted") and "\n" not in text
    assert f"inputs_hash {small['inputs_hash'][:12]}..." in text and "`ntp estimate ... -o`" in text


def test_a_plan_from_before_the_layout_was_hashed_says_so(small, tmp_path):
    """Its inputs_hash is that of model, training and cluster alone (the committed plans' old
    hashes): not 'edited', but too old to tell an edited layout."""
    from ntp_planner.plan import ClusterInputs

    plan = Plan.model_validate(small)
    old = inputs_hash(plan.model, plan.training, ClusterInputs.model_validate(small["cluster"]), None)
    assert old != small["inputs_hash"]
    file = tmp_path / "plan.json"
    file.write_text(json.dumps({**small, "inputs_hash": old}))
    with pytest.raises(InputError, match=re.escape(f"{file} was made before inputs_hash covered the layout")):
        Plan.load(file)


PREDICTED_LIES = [
    (("predicted", "mfu"), 5.0, "predicted.mfu is 5; it must be a fraction in (0, 1]"),
    (("predicted", "mfu"), -0.5, "predicted.mfu is -0.5; it must be a fraction in (0, 1]"),
    (("predicted", "mfu_causal"), 0, "predicted.mfu_causal is 0; it must be a fraction in (0, 1]"),
    (("predicted", "stage_time_s"), [], "predicted.stage_time_s has 0 entries but the layout has pp 2 stages"),
    (("predicted", "stage_time_s", 0), -1.0, "predicted.stage_time_s[0] is -1; it must be a finite number above 0"),
    (("predicted", "stage_memory_bytes"), [1e9], "predicted.stage_memory_bytes has 1 entries but the layout has pp 2"),
    (("predicted", "time_breakdown_s", "compute"), -0.1, "predicted.time_breakdown_s.compute is -0.1"),
    (("predicted", "tflops_per_gpu"), 0, "predicted.tflops_per_gpu is 0"),
    (("predicted", "bottleneck_stage"), 2, "predicted.bottleneck_stage is 2; it must be a stage, 0..1"),
    # a number edited alone, within its bounds, no longer agrees with the others
    (("predicted", "step_time_s"), 1e300, "the sum of time_breakdown_s is"),
    (("predicted", "time_breakdown_s", "banana"), 1e9, "the sum of time_breakdown_s is"),
    (("predicted", "memory_per_gpu_bytes"), 1e15, "the sum of memory_breakdown_bytes is"),
    (("predicted", "hbm_bytes"), 1e15, "hbm_bytes is 1e+15 but the GPU's HBM is"),
    (("predicted", "tokens_per_s"), 1e12, "tokens_per_s x step_time_s is"),
    (("megatron", "mfu"), 5.0, "megatron.mfu: 5 must be a fraction in (0, 1]"),
    (("objective",), "banana", "objective: Input should be 'step-time' or 'goodput'"),
    (("source",), "me", "source: Input should be 'search' or 'user'"),
    (("goodput_strategy",), "pray", "goodput_strategy: Input should be 'restart'"),
    (("training", "dtype"), "mxfp8", "H100-SXM (hopper) has no mxfp8 tensor cores"),
]


@pytest.mark.parametrize(("path", "value", "message"), PREDICTED_LIES)
def test_predictions_a_step_cannot_have_are_refused(small, tmp_path, path, value, message):
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(_edited(small, path, value)))
    with pytest.raises(InputError) as err:
        Plan.load(file)
    text = str(err.value)
    assert "\n" not in text and str(file) in text and message in text, text


def test_the_unedited_small_plan_loads(small, tmp_path):
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(small))
    assert Plan.load(file).megatron_gap == 0.0


def test_hostile_plan_files(tmp_path):
    file = tmp_path / "plan.json"
    file.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(InputError, match="nests deeper than 32 levels"):
        Plan.load(file)
    file.write_bytes(b'{"schema_version": 2, "source": "caf\xe9"}')
    with pytest.raises(InputError, match=r"plan .*plan.json is not UTF-8 text \(byte 0xe9"):
        Plan.load(file)
    file.write_text("[1, 2]")
    with pytest.raises(InputError, match="must hold a mapping"):
        Plan.load(file)


NUMBERS = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=3),
)


def _leaves(data, path=()):
    """Paths of every number in a JSON tree."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _leaves(v, (*path, k))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _leaves(v, (*path, i))]
    return [path] if isinstance(data, int | float) and not isinstance(data, bool) else []


@settings(max_examples=150, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=NUMBERS)
def test_any_edited_number_loads_or_fails_in_one_sentence(small, tmp_path, data, value):
    path = data.draw(st.sampled_from(_leaves(small)))
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(_edited(small, path, value)))
    try:
        plan = Plan.load(file)
    except InputError as exc:
        assert "\n" not in str(exc) and str(file) in str(exc)
        return
    assert plan.layout.world_size == plan.cluster.num_gpus == len(set(plan.placement))
    assert math.isfinite(plan.predicted.step_time_s) and plan.predicted.step_time_s > 0


@pytest.mark.parametrize("name", ["dense_pp_interleaved", "moe", "ntp_replanned"])
def test_committed_plans_keep_their_inputs_hash(name):
    """Fields added to the inputs later (gpus_per_domain, a cluster's custom_gpu) leave older
    plans' hashes, and the hashes their exported configs carry, as they were."""
    plan = Plan.load(Path(__file__).parent / "plans" / f"{name}.json")
    assert inputs_hash(plan.model, plan.training, plan.cluster, plan.layout) == plan.inputs_hash


def test_plan_json_output_loads_back_with_its_counts_checked(tmp_path):
    # `ntp plan --json` prints the plan with params_total / params_active beside it; that output is a
    # plan file too, and counts that disagree with the model are an edit
    plan = Plan.load(Path(__file__).parent / "plans" / "moe_folded.json")
    shown = json.loads(plan.model_dump_json()) | {
        "params_total": plan.model.params_total,
        "params_active": plan.model.params_active,
    }
    (tmp_path / "ok.json").write_text(json.dumps(shown))
    assert Plan.load(tmp_path / "ok.json") == plan
    shown["params_active"] = plan.model.params_total
    (tmp_path / "bad.json").write_text(json.dumps(shown))
    with pytest.raises(InputError, match=f"gives params_active {plan.model.params_total} but its model has"):
        Plan.load(tmp_path / "bad.json")
