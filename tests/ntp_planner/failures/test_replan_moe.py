"""NTP for MoE: a failure's experts re-hosted on the survivors of its EP group, or the group
dropped (ntp_planner.failures.experts), checked by hand on DeepSeek-MoE-16B at tp 2, ep 8, etp 1."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.failures.replan import Replanner
from ntp_planner.replan_result import ReplanResult
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster, InputError

MODEL = MODELS["deepseek-moe-16b"]  # 64 routed experts, 28 layers, the first dense


def _plan(gpus=16, zero=1, ep=8):
    lay = ParallelLayout(tp=2, dp=gpus // 2, ep=ep, etp=1, micro_batch=1, global_batch=64, sequence_parallel=True,
                         zero=zero)  # fmt: skip
    return plan_from_layout(MODEL, TrainingSpec(seq_len=4096, global_batch=64), Cluster(spec=CLUSTERS["dgx-h100"],
                            num_gpus=gpus), lay)  # fmt: skip


@pytest.fixture(scope="module")
def rp():
    return Replanner(_plan())


def test_the_grid_and_one_experts_state_by_hand():
    em = Replanner(_plan(zero=0)).experts
    # etp 1, ep 8 over the 16 ranks of the stage: two groups of 8 consecutive ranks, 8 experts each
    assert em.groups.tolist() == [list(range(8)), list(range(8, 16))] and em.q == 8
    # ZeRO-0 bf16: 2 (weight) + 4 (fp32 gradient) + 12 (master, two moments) bytes per parameter;
    # one expert: 27 MoE layers x 3 matrices x 2048 x 1408
    assert em.shard_bytes == pytest.approx(27 * 3 * 2048 * 1408 * 18, rel=1e-9)


def test_imbalance_factor_by_hand(rp):
    em = rp.experts
    lost = np.zeros(16, dtype=bool)
    lost[[9, 12]] = True  # two of group 1's 8 members: 16 experts over 6 survivors, the busiest takes 3 more
    fate = em.fate(1, lost, "ntp")
    assert fate.mode == "rehosted" and fate.lost == (9, 12)
    assert fate.load_factor == (8 + math.ceil(16 / 6)) / 8
    assert fate.moved_bytes == pytest.approx(16 * em.shard_bytes)
    assert em.fate(0, lost, "ntp") is None
    owners = em.owners(fate)
    held = sorted(sum(o == [r] for o in owners) for r in fate.ranks if r not in fate.lost)
    assert held == [10, 10, 11, 11, 11, 11]  # 8 each, and the 16 lost ones spread 2, 2, 3, 3, 3, 3
    assert em.speed(fate.load_factor) == pytest.approx(1 / (1 + em.share * (fate.load_factor - 1)))


def test_one_failure_rehosts_and_beats_dropping_the_group(rp):
    ntp, drop = rp.replan(frozenset({3}), "ntp"), rp.replan(frozenset({3}), "dp-drop")
    (hosted,) = ntp.experts
    assert hosted.mode == "rehosted" and hosted.load_factor == (8 + math.ceil(8 / 7)) / 8
    # the group's four replicas run in lockstep, at the degraded replica's pace; the others in full
    members = sorted({r // 2 for r in hosted.ep_group + hosted.lost})
    batches = {x.replica: x.local_batch for x in ntp.replicas}
    b = batches[members[0]]
    assert all(batches[r] == b for r in members) and 0 < b < 8
    assert all(batches[r] == 8 for r in range(8) if r not in members)
    assert ntp.throughput_relative == pytest.approx((4 * 8 + 4 * b) / 64)
    # dp-drop loses the failed replica's whole EP group: 4 of 8 replicas
    assert drop.throughput_relative == 0.5 and [x.mode for x in drop.experts] == ["dropped"]
    assert ntp.throughput_relative > drop.throughput_relative
    assert rp.throughput(frozenset({3}), "ntp").throughput_relative == ntp.throughput_relative


def test_rehost_or_drop_either_side_of_the_memory_crossover():
    rp = Replanner(_plan())
    need = math.ceil(8 / 7) * rp.experts.shard_bytes  # the busiest survivor's extra state
    modes = {}
    for spare in (need * 0.999, need * 1.001):
        rp.experts.spare_bytes = spare
        rp._decided.clear()
        r = rp.replan(frozenset({3}), "ntp")
        modes[spare > need] = ([x.mode for x in r.experts], r.throughput_relative)
    assert modes[False] == (["dropped"], 0.5)
    assert modes[True][0] == ["rehosted"] and modes[True][1] > 0.5


def test_an_edited_rehosting_is_refused(rp):
    plan, r = rp.plan, rp.replan(frozenset({3}), "ntp")
    data = r.model_dump()
    data["experts"][0]["owners"][0] = [data["experts"][0]["lost"][0]]  # an expert on a rank that no longer runs
    with pytest.raises(ValueError, match="must hold every expert once, on its surviving ranks"):
        ReplanResult.model_validate(data)
    data = r.model_dump()
    data["experts"][0]["stage"] = 1  # the plan has one stage
    with pytest.raises(InputError, match="not an EP group"):
        ReplanResult.model_validate(data).check_against(plan)


def test_plans_without_expert_parallelism_list_no_groups():
    r = Replanner(_plan(ep=1)).replan(frozenset({3}), "ntp")
    assert r.experts == [] and Replanner(_plan(ep=1)).experts is None


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.sets(st.integers(0, 31), min_size=1, max_size=6), st.sampled_from(["ntp", "ntp-pw", "dp-drop"]))
def test_no_expert_is_lost_or_held_by_a_rank_that_does_not_run(failed, policy):
    rp = _RP32
    r = rp.replan(frozenset(failed), policy)
    ReplanResult.model_validate(r.model_dump()).check_against(rp.plan)
    for x in r.experts:
        assert not set(x.ep_group) & set(x.lost)
        assert all(r.rank_to_gpu[g] is None for g in x.lost)
        if x.mode == "rehosted":
            assert len(x.owners) == MODEL.num_experts and all(len(o) == 1 and o[0] in x.ep_group for o in x.owners)
            assert all(r.rank_to_gpu[o[0]] is not None for o in x.owners)
    dropped = {x.replica for x in r.replicas if x.status == "dropped"}
    for x in r.experts:  # a dropped group's replicas all stop
        if x.mode == "dropped":
            assert {g // 2 for g in x.ep_group + x.lost} <= dropped
    assert r.throughput_relative == pytest.approx(rp.throughput(frozenset(failed), policy).throughput_relative)


_RP32 = Replanner(_plan(gpus=32))


def test_replan_json_and_table_show_the_experts_and_the_counts(rp, tmp_path):
    from typer.testing import CliRunner

    from ntp_planner.cli import app

    rp.plan.save(tmp_path / "p.json")
    out = CliRunner().invoke(app, ["replan", str(tmp_path / "p.json"), "--failed", "3", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert (data["params_total"], data["params_active"]) == (MODEL.params_total, MODEL.params_active)
    assert [x["mode"] for x in data["experts"]] == ["rehosted"]
    (tmp_path / "r.json").write_text(out.stdout)  # the --json output loads back as the re-plan it shows
    assert ReplanResult.load(tmp_path / "r.json", rp.plan).experts == rp.replan(frozenset({3}), "ntp").experts
    table = CliRunner().invoke(app, ["replan", str(tmp_path / "p.json"), "--failed", "3"])
    assert "re-hosted" in table.stdout and "16.4B parameters" in table.stdout


def test_the_nonuniform_tp_export_says_what_it_cannot_express(rp):
    from ntp_planner.emitters.megatron import nonuniform_tp_settings

    r = rp.replan(frozenset({3}), "ntp")
    settings, warnings = nonuniform_tp_settings(rp.plan, r)
    # only the replica at reduced TP counts as reduced; those paced by the re-hosted experts run full TP
    assert settings["num_reduced_tp_dp_ranks"] == sum(min(x.stage_tp) < 2 for x in r.replicas if x.stage_tp[0])
    assert settings["num_reduced_tp_dp_ranks"] == 1
    assert any("1 EP groups re-host the experts" in w and "1.25x" in w for w in warnings)


def test_deepseek_v3_replans_with_its_mla_units():
    from cost_models.degraded import replica_flops, work_ratio

    model = MODELS["deepseek-v3"]
    flops = replica_flops(model, TrainingSpec(seq_len=4096))
    assert flops["heads"][1] == 128 and flops["experts"][1] == model.moe_ffn_hidden_size
    # the latent down-projections stay whole on every rank: TP 8 -> 7 slows them not at all, the
    # per-head parts by 19/16 (128 heads: 19 on the fullest of 7, 16 of 8)
    ratio = work_ratio(model, TrainingSpec(seq_len=4096), 8, 7)
    assert 1.0 < ratio < 19 / 16


def test_unfolded_experts_reshard_with_ntp_and_keep_their_groups():
    # etp = tp: a degraded replica re-shards its experts over its surviving TP ranks like its MLP, so
    # its EP groups keep every member; only a dropped replica's ranks leave them
    lay = ParallelLayout(tp=2, dp=8, ep=8, micro_batch=1, global_batch=64, sequence_parallel=True, zero=1)
    plan = plan_from_layout(MODEL, TrainingSpec(seq_len=4096, global_batch=64), Cluster(spec=CLUSTERS["dgx-h100"],
                            num_gpus=16), lay)  # fmt: skip
    rp = Replanner(plan)
    r = rp.replan(frozenset({3}), "ntp")
    assert r.experts == [] and [x.status for x in r.replicas].count("degraded") == 1
    both = rp.replan(frozenset({2, 3}), "ntp")  # a TP group lost whole: its replica drops, its groups lose it
    assert {x.mode for x in both.experts} == {"rehosted"} and len(both.experts) == 2


def test_a_group_listed_under_another_stage_is_refused():
    lay = ParallelLayout(tp=2, pp=2, dp=4, ep=4, etp=1, micro_batch=1, global_batch=64, sequence_parallel=True,
                         zero=1)  # fmt: skip
    plan = plan_from_layout(MODEL, TrainingSpec(seq_len=4096, global_batch=64), Cluster(spec=CLUSTERS["dgx-h100"],
                            num_gpus=16), lay)  # fmt: skip
    r = Replanner(plan).replan(frozenset({3}), "ntp")
    assert r.experts and all(x.stage == min(x.ep_group + x.lost) // 8 for x in r.experts)
    data = r.model_dump()
    data["experts"][0]["stage"] = 1 - data["experts"][0]["stage"]
    with pytest.raises(InputError, match="not an EP group of the plan's stage"):
        ReplanResult.model_validate(data).check_against(plan)


def test_a_group_listed_twice_is_refused(rp):
    r = rp.replan(frozenset({3}), "ntp")
    data = r.model_dump()
    data["experts"].append(data["experts"][0])
    with pytest.raises(InputError, match="is listed twice"):
        ReplanResult.model_validate(data).check_against(rp.plan)
