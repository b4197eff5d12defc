"""Spare domains as a pool every policy draws on, the fewest that keep a fixed batch, and a
degraded replica's batch counted in sequences: hand-computed small clusters."""

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.degraded import degraded_step_time
from ntp_planner.failures.replan import Replanner
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster

# heads (56) and FFN columns (28,672) split evenly over 8 and 7 GPUs (as in test_replan)
SEVEN = MODELS["llama3-8b"].model_copy(
    update={
        "name": "seven",
        "hidden_size": 7168,
        "num_heads": 56,
        "num_kv_heads": 8,
        "head_dim": 128,
        "ffn_hidden_size": 28672,
        "num_layers": 8,
        "vocab_size": 57344,
    }
)


def two_replicas(pp, dp, gpus, batch):
    layout = ParallelLayout(tp=8, pp=pp, dp=dp, global_batch=batch, sequence_parallel=True, distributed_optimizer=True)
    training = TrainingSpec(seq_len=4096, global_batch=batch)
    return plan_from_layout(SEVEN, training, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus), layout)


# 4 replicas of 2 DGX domains (TP8 x PP2), 8 sequences each (micro-batches of 1), global batch 32;
# GPU g sits in domain g // 8. One GPU fails in each of domains 0, 3 and 5.
FAILED = frozenset({3, 25, 42})


@pytest.fixture(scope="module")
def small():
    return Replanner(two_replicas(pp=2, dp=4, gpus=64, batch=32))


def test_a_tp7_replica_of_the_small_cluster_runs_6_sequences(small):
    assert small.sequences_at(7) == 6  # the premise of the counts below
    r = small.replan(FAILED, "ntp")
    # packing: replica 3 holds two degraded slots, replica 2 one (and a healthy slot): both at TP7
    assert [(x.status, x.stage_tp, x.local_batch) for x in r.replicas[2:]] == [("degraded", [7, 7], 6)] * 2
    assert r.global_batch_reached == 8 + 8 + 6 + 6


@pytest.mark.parametrize(
    ("policy", "need"),
    [
        # dp-drop drops replicas 2 and 3 (16 sequences short). Replacing the one degraded slot of
        # replica 2 saves it (1 domain) and an extra replica of 2 domains makes up replica 3: 3.
        # Replacing all three slots: 3. Two extra replicas: 4. Fewest: 3.
        ("dp-drop", 3),
        # ntp runs 28 of 32 sequences: one extra replica (2 domains) makes up the 4 missing;
        # replacing slots saves 2 sequences a replica at best and needs 3 domains to save all. Fewest: 2.
        ("ntp", 2),
        # ntp-pw keeps every replica's 8 sequences at 8/7 power-boosted speed: no spare at all.
        ("ntp-pw", 0),
    ],
)
def test_fewest_spares_of_a_small_cluster_by_hand(small, policy, need):
    assert small.fewest_spares(FAILED, policy) == need
    kept = small.replan(FAILED, policy, spares=need, batch="fixed")
    assert not kept.paused and kept.global_batch_reached == 32 and kept.spares_used == need
    if need:  # the minimum is one more than a pool that pauses
        assert small.replan(FAILED, policy, spares=need - 1, batch="fixed").paused


def test_ntp_makes_up_its_batch_with_a_whole_extra_replica(small):
    r = small.replan(FAILED, "ntp", spares=4, batch="fixed")
    assert (r.extra_replicas, r.spares_used, r.global_batch_reached, r.throughput_relative) == (1, 2, 32, 1.0)
    assert r.spares_note == "2 of 4 spare domains used: 1 extra replica formed"
    assert [x.status for x in r.replicas] == ["healthy", "healthy", "degraded", "degraded"]  # they keep running
    # a flexible batch takes the extra replica too, but never grows past the plan's
    assert small.replan(FAILED, "ntp", spares=4).throughput_relative == 1.0
    assert small.throughput(FAILED, "ntp", spares=4).spares_used == 2


def test_one_lost_domain_and_pp_spares_keep_ntps_batch(small):
    lost = frozenset(range(8, 16))  # domain 1: a TP group with no survivor, so its replica drops even under NTP
    assert small.replan(lost, "ntp", batch="fixed").paused
    r = small.replan(lost, "ntp", spares=2, batch="fixed")  # K = PP
    assert not r.paused and r.global_batch_reached == 32 and r.extra_replicas == 0 and r.spares_used == 1
    assert small.fewest_spares(lost, "ntp") == 1  # the lost domain replaced


def test_spares_apply_to_every_policy_and_the_spares_policy_is_its_fallback(small):
    for policy in ("dp-drop", "ntp", "ntp-pw"):
        with_pool = small.replan(FAILED, policy, spares=3, batch="fixed")
        assert with_pool.throughput_relative == 1.0, policy
    assert small.replan(FAILED, "spares", spares=3, fallback="ntp").spares_used == 2
    assert small.replan(FAILED, "spares", spares=3, fallback="dp-drop").spares_used == 3


def _mb2_plan():
    """SEVEN at TP8 x DP2 on 16 GPUs, micro-batches of 2 sequences, 4 per replica (8 sequences)."""
    layout = ParallelLayout(
        tp=8, dp=2, global_batch=16, micro_batch=2, sequence_parallel=True, distributed_optimizer=True
    )
    training = TrainingSpec(seq_len=4096, global_batch=16)
    return plan_from_layout(SEVEN, training, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16), layout)


def test_a_degraded_replica_keeps_sequences_not_whole_micro_batches():
    plan = _mb2_plan()
    r = Replanner(plan).replan(frozenset({3}), "ntp")
    degraded = r.replicas[1]
    br, healthy = plan.predicted.time_breakdown_s, plan.predicted.step_time_s
    # 7 sequences = 3.5 micro-batches' time fits, 8 do not; whole micro-batches would keep 3 (6 sequences)
    assert degraded.local_batch == 7
    assert degraded_step_time(br, 4, 7 / 2, 8, 7, 8 / 7) <= healthy < degraded_step_time(br, 4, 8 / 2, 8, 7, 8 / 7)
    assert degraded_step_time(br, 4, 3, 8, 7, 8 / 7) <= healthy  # so the old rule's 6 was a whole sequence short
    assert degraded.reason.endswith(
        "7 of 8 sequences fit the healthy step, as 4 micro-batches (3 of 2 sequences, 1 of 1)"
    )
    assert r.global_batch_reached == 15
    r.check_against(plan)  # a batch that is not whole micro-batches is a valid re-plan


def test_cli_replan_says_how_it_used_the_pool(tmp_path):
    import json

    from typer.testing import CliRunner

    from ntp_planner.cli import app

    path = tmp_path / "plan.json"
    two_replicas(pp=2, dp=4, gpus=64, batch=32).save(path)
    args = ["replan", str(path), "--failed", "3,25,42", "--policy", "ntp", "--spares", "4", "--batch", "fixed"]
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert (data["extra_replicas"], data["spares_used"], data["global_batch_reached"]) == (1, 2, 32)
    text = CliRunner().invoke(app, args).stdout
    assert "spare domains      2 of 4 spare domains used: 1 extra replica formed" in text


def test_the_pool_curve_is_the_packing_redone_for_every_replacement_count():
    """Brute force: for every x, re-pack with the x worst degraded slots replaced and add up what each
    replica runs; pp 2 x cp 2, so a replica's stage runs at the fewer survivors of its two cp slices."""
    import numpy as np

    from ntp_planner.failures.packing import degraded_slots, pool_curve

    layout = ParallelLayout(tp=8, pp=2, cp=2, dp=4, global_batch=32, sequence_parallel=True, distributed_optimizer=True)
    training = TrainingSpec(seq_len=4096, global_batch=32)
    plan = plan_from_layout(SEVEN, training, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=128), layout)
    replanner = Replanner(plan)
    rng = np.random.default_rng(5)
    for _ in range(5):
        failed = frozenset(int(g) for g in rng.choice(128, size=7, replace=False))
        decider, fails, degraded, _ = degraded_slots(replanner, failed, "ntp", 0, "dp-drop", frozenset())
        _, curve = pool_curve(replanner, fails, degraded, decider)
        for x in range(len(degraded) + 1):
            order = np.concatenate([np.flatnonzero(fails == 0), np.full(x, -1), degraded[x:]])
            slots = np.where(order >= 0, 8 - fails[np.maximum(order, 0)], 8).reshape(4, 2, 2).min(axis=2)
            assert curve[x] == sum(replanner.decide("ntp", row.tolist()).sequences for row in slots)
