"""Re-planning after failures: hand-computed cases, closed forms, packing, uneven shards, CLI."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.degraded import (
    degraded_step_time,
    power_for_speed,
    slowest_share_ratio,
    speed_at_power,
    uneven_shares,
    work_ratio,
)
from ntp_planner.cli import app
from ntp_planner.failures.replan import Replanner
from ntp_planner.failures.sampling import explicit_failures, lost_domains, random_failures
from ntp_planner.plan import Plan
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster, InputError

# A model whose heads (56) and FFN columns (28,672) split evenly over 8 and over 7 GPUs, so one
# failure in a TP8 group means exactly 8/7 more work per surviving GPU.
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


def two_replicas(model=SEVEN, pp=1, dp=2, gpus=16, batch=16):
    layout = ParallelLayout(tp=8, pp=pp, dp=dp, global_batch=batch, sequence_parallel=True, distributed_optimizer=True)
    training = TrainingSpec(seq_len=4096, global_batch=batch)
    return plan_from_layout(model, training, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus), layout)


def test_dp_drop_keeps_half_of_two_replicas():
    r = Replanner(two_replicas()).replan(frozenset({3}), "dp-drop")
    assert r.throughput_relative == 0.5
    assert [x.status for x in r.replicas] == ["healthy", "dropped"]
    assert r.rank_to_gpu[8:] == [None] * 8 and sorted(r.idle_gpus) == [g for g in range(8) if g != 3]


def test_ntp_runs_tp7_with_the_largest_batch_within_the_healthy_step():
    plan = two_replicas()
    r = Replanner(plan).replan(frozenset({3}), "ntp")
    degraded = r.replicas[1]
    assert degraded.stage_tp == [7] and degraded.status == "degraded"
    assert work_ratio(SEVEN, TrainingSpec(seq_len=4096), 8, 7) == pytest.approx(8 / 7)
    m = plan.layout.num_micro_batches
    br, healthy = plan.predicted.time_breakdown_s, plan.predicted.step_time_s
    local = degraded.local_batch  # micro-batch size 1
    assert 1 <= local < m
    assert degraded_step_time(br, m, local, 8, 7, 8 / 7) <= healthy
    assert degraded_step_time(br, m, local + 1, 8, 7, 8 / 7) > healthy
    assert r.throughput_relative == pytest.approx((m + local) / (2 * m))
    # the 7 survivors hold TP ranks 0-6 of the degraded replica, rank 7 is an inactive slot
    assert r.rank_to_gpu[8:16] == [0, 1, 2, 4, 5, 6, 7, None]
    assert r.reshard is not None and r.reshard.exposed_s <= r.reshard.time_s


def test_the_replan_and_the_simulators_throughput_take_the_one_degraded_replica_cost():
    from cost_models.degraded import degraded_breakdown

    # brute force over the local batch with cost_models.degraded's breakdown: the re-plan's
    # degraded replica runs the most sequences whose step stays within the healthy one, and the
    # throughput the simulator and the sweep ask for (``Replanner.throughput``) is that batch's
    plan = two_replicas()
    m, healthy = plan.layout.num_micro_batches, plan.predicted.step_time_s
    work = work_ratio(SEVEN, plan.training, 8, 7)
    assert work == pytest.approx(8 / 7, rel=1e-12)  # heads and columns split evenly over 7
    fits = [
        b
        for b in range(1, m + 1)
        if sum(degraded_breakdown(plan.predicted.time_breakdown_s, m, b, 8, 7, work).values()) <= healthy
    ]
    replanner = Replanner(plan)
    assert replanner.replan(frozenset({3}), "ntp").replicas[1].local_batch == max(fits)
    assert replanner.throughput(frozenset({3}), "ntp").throughput_relative == pytest.approx((m + max(fits)) / (2 * m))


def test_ntp_pw_boost_is_the_inverse_of_the_power_curve():
    r = Replanner(two_replicas()).replan(frozenset({3}), "ntp-pw")
    degraded = r.replicas[1]
    assert degraded.local_batch == r.replicas[0].local_batch  # batch kept
    assert degraded.power == [pytest.approx(power_for_speed(8 / 7))]
    assert speed_at_power(degraded.power[0]) == pytest.approx(8 / 7)
    assert r.throughput_relative == 1.0
    # with the boost capped below what 8/7 needs, the replica falls back to fewer micro-batches
    capped = Replanner(two_replicas(), max_power=1.1).replan(frozenset({3}), "ntp-pw")
    assert capped.replicas[1].local_batch < degraded.local_batch and capped.replicas[1].power == [1.1]


def test_power_curve_matches_the_paper():
    # perf/W -2.8% at 1.1x and -6.5% at 1.2x power (NTP paper): speed = power x (1 - loss)
    assert speed_at_power(1.1) == pytest.approx(1.1 * 0.972)
    assert speed_at_power(1.2) == pytest.approx(1.2 * 0.935)
    assert math.isinf(power_for_speed(1.5, max_power=1.3))


def test_uneven_sharding_charges_the_fullest_gpu():
    shares = uneven_shares(32, 30)
    assert sorted(shares, reverse=True)[:2] == [2, 2] and shares.count(1) == 28 and sum(shares) == 32
    assert slowest_share_ratio(32, 32, 30) == 2.0  # 2 heads instead of 1 on the slowest GPU
    model = MODELS["llama3-8b"]  # 32 heads, FFN 14,336
    ratio = work_ratio(model, TrainingSpec(seq_len=4096), 32, 30)
    ffn_ratio = math.ceil(14336 / 30) / (14336 / 32)
    assert ffn_ratio < ratio < 2.0  # between the MLP's mild and the attention's harsh penalty
    assert ratio > 32 / 30  # worse than an even split would be


def test_dp_drop_matches_the_hypergeometric_closed_form():
    plan = two_replicas(dp=128, gpus=1024, batch=128)  # one TP8 group per replica
    replanner, cluster = Replanner(plan), plan.cluster.build()
    rng, failures, samples = np.random.default_rng(7), 10, 400
    kept = [
        replanner.throughput(random_failures(cluster, failures / 1024, rng), "dp-drop").throughput_relative
        for _ in range(samples)
    ]
    # expected fraction of untouched groups: C(N - g, F) / C(N, F)
    exact = math.comb(1024 - 8, failures) / math.comb(1024, failures)
    assert abs(np.mean(kept) - exact) < 4 * np.std(kept) / math.sqrt(samples)
    assert exact == pytest.approx((1 - failures / 1024) ** 8, abs=0.01)


@pytest.mark.parametrize("domains_failed", [1, 3, 4, 5, 8])
def test_packing_drops_ceil_d_over_r_replicas(domains_failed):
    plan = two_replicas(pp=4, dp=8, gpus=256, batch=64)  # R = 4 domains per replica
    # one GPU in each of D domains, spread over different replicas before packing
    failed = frozenset(8 * (4 * d + 1) % 256 + 3 for d in range(domains_failed))
    r = Replanner(plan).replan(failed, "dp-drop")
    dropped = sum(x.status == "dropped" for x in r.replicas)
    assert r.degraded_groups == domains_failed and dropped == math.ceil(domains_failed / 4)


def test_spares_replace_degraded_domains_then_fall_back():
    plan = two_replicas(pp=4, dp=8, gpus=256, batch=64)
    failed = frozenset({3, 40, 77, 150, 201})  # 5 domains
    assert Replanner(plan).replan(failed, "spares", spares=5).throughput_relative == 1.0
    # 5 degraded slots pack into replica 7 (4 of them) and replica 6 (the 5th and 3 healthy): one
    # spare domain for the 5th saves replica 6; two more could not save replica 7, so they stay idle
    part = Replanner(plan).replan(failed, "spares", spares=3, fallback="dp-drop")
    assert part.spares_used == 1 and part.throughput_relative == 7 / 8
    assert part.spares_note == "1 of 3 spare domains used: 1 degraded TP group replaced"


def test_fixed_batch_pauses_when_short():
    plan = two_replicas()
    assert Replanner(plan).replan(frozenset({3}), "ntp", batch="fixed").paused
    assert not Replanner(plan).replan(frozenset({3}), "ntp-pw", batch="fixed").paused


def test_rank_map_uses_each_healthy_gpu_once():
    plan = two_replicas(pp=4, dp=8, gpus=256, batch=64)
    failed = frozenset({3, 4, 40, 77})
    r = Replanner(plan).replan(failed, "ntp")
    used = [g for g in r.rank_to_gpu if g is not None]
    assert len(used) == len(set(used)) and not set(used) & failed
    assert set(used) | set(r.idle_gpus) | failed == set(range(256))


def test_replicas_keep_their_gpus_until_the_packing_moves_them():
    """pp 2 x dp 4 of TP8 on 64 GPUs: replica r, stage s is ranks and GPUs 8 (r + 4 s) ... + 7."""
    plan = two_replicas(pp=2, dp=4, gpus=64, batch=32)
    replanner = Replanner(plan)
    assert replanner.replan(frozenset(), "ntp").rank_to_gpu == plan.placement == list(range(64))
    # GPU 27 is in replica 3 (stage 0): replicas 0-2 keep theirs; replica 3 takes stage 1's slot
    # (GPUs 56-63) for stage 0 and the degraded slot (24-31, without 27) for stage 1 at TP7
    r = replanner.replan(frozenset({27}), "ntp")
    assert r.rank_to_gpu[:24] == list(range(24)) and r.rank_to_gpu[32:56] == list(range(32, 56))
    assert r.rank_to_gpu[24:31] == list(range(56, 63)) and r.rank_to_gpu[56:63] == [24, 25, 26, 28, 29, 30, 31]
    assert r.rank_to_gpu[31] is None and r.rank_to_gpu[63] is None


def test_the_throughput_path_agrees_with_the_full_result():
    """Two failed TP8 slots (7 survivors each) packed into replica 7 with two healthy slots."""
    replanner = Replanner(two_replicas(pp=4, dp=8, gpus=256, batch=64))
    failed = frozenset({3, 40})
    cases = [
        # (policy, spares, idle GPUs: fast path, replicas' slots, whole cluster)
        ("ntp", 0, 2, 2, 2),  # TP7 everywhere: one idle GPU in each healthy slot
        ("dp-drop", 0, 8 + 8 + 7 + 7, 30, 30),  # the whole replica idles
        # one spare domain cannot save replica 7 (two degraded slots): the pool stays unused
        ("spares", 1, 8 + 8 + 7 + 7, 30, 30),
    ]
    for policy, spares, fast_idle, slot_idle, cluster_idle in cases:
        full = replanner.replan(failed, policy, spares)
        fast = replanner.throughput(failed, policy, spares)
        assert fast.throughput_relative == full.throughput_relative, policy
        assert fast.idle_gpus == fast_idle and sum(r.gpus_idle for r in full.replicas) == slot_idle, policy
        assert len(full.idle_gpus) == cluster_idle and full.replicas[7].status != "healthy"
    assert replanner.throughput(failed, "dp-drop").throughput_relative == 7 / 8


def test_failure_inputs_are_validated():
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    with pytest.raises(ValueError, match="outside 0..15"):
        explicit_failures(cluster, [3, 16])
    with pytest.raises(ValueError, match="listed more than once"):
        explicit_failures(cluster, [3, 3])
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\)"):
        random_failures(cluster, 1.0, np.random.default_rng(0))
    node = random_failures(Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=144), 0.5, np.random.default_rng(0), "node")
    assert len(node) == 72  # 18 of 36 four-GPU hosts
    assert all({g // 4 * 4 + i for i in range(4)} <= node for g in node)  # whole hosts fail together


@pytest.fixture()
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    two_replicas(pp=4, dp=8, gpus=256, batch=64).save(path)
    return path


def test_cli_replan_and_sweep(plan_file, tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["replan", str(plan_file), "--failed", "3,40", "--policy", "ntp", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["degraded_groups"] == 2 and 0 < data["throughput_relative"] < 1
    same = runner.invoke(app, ["replan", str(plan_file), "--failed-fraction", "0.01", "--seed", "3", "--json"])
    again = runner.invoke(app, ["replan", str(plan_file), "--failed-fraction", "0.01", "--seed", "3", "--json"])
    assert same.stdout == again.stdout  # seeded
    png = tmp_path / "loss.png"
    rows = runner.invoke(
        app,
        [
            "sweep",
            str(plan_file),
            "--fractions",
            "0.005,0.01",
            "--samples",
            "20",
            "--policies",
            "dp-drop,ntp",
            "--plot",
            str(png),
            "--json",
        ],
    )
    assert rows.exit_code == 0, rows.output
    table = json.loads(rows.stdout)
    assert [(r["policy"], r["fraction"]) for r in table] == [
        ("dp-drop", 0.005),
        ("ntp", 0.005),
        ("dp-drop", 0.01),
        ("ntp", 0.01),
    ]
    assert all(r["p5_loss"] <= r["mean_loss"] <= r["p95_loss"] for r in table)
    assert all(b["mean_loss"] <= a["mean_loss"] for a, b in zip(table[::2], table[1::2], strict=True))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--failed", "3,999"], "outside 0..255"),
        (["--failed", "3,3"], "listed more than once"),
        (
            ["--failed-fraction", "1.5"],
            "Invalid value for '--failed-fraction': Input should be less than or equal to 1",
        ),
        (["--failed-fraction", "1"], "--failed-fraction 1 must lie in [0, 1): with every GPU failed nothing is left"),
        (["--failed", "x"], "must be comma-separated whole numbers"),
        ([], "give exactly one of --failed"),
        (["--failed", "3", "--policy", "magic"], "'magic' is not one of 'dp-drop', 'ntp'"),
        # an option the policy does not use is refused, not ignored
        (["--failed", "3", "--policy", "ntp", "--fallback", "ntp"], "--fallback ntp only applies to --policy spares"),
        (
            ["--failed", "3", "--policy", "ntp", "--max-power", "1.5"],
            "--max-power 1.5 only applies when ntp-pw decides",
        ),
        (["--failed", "3", "--policy", "spares", "--max-power", "1.5"], "ntp-pw), not dp-drop; drop it or use ntp-pw"),
    ],
)
def test_cli_replan_bad_input(plan_file, args, message):
    result = CliRunner().invoke(app, ["replan", str(plan_file), *args])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_cli_rejects_other_schema_versions(plan_file):
    data = json.loads(plan_file.read_text())
    plan_file.write_text(json.dumps({**data, "schema_version": 1}))
    for cmd in (["replan", str(plan_file), "--failed", "3"], ["sweep", str(plan_file), "--samples", "2"]):
        result = CliRunner().invoke(app, cmd)
        assert result.exit_code == 2 and "schema version 1" in result.stderr


def test_the_ntp_study_setup_through_ntp_plan(tmp_path):
    """b200-nvl32 + ntp-480b: a plan from `ntp plan` re-plans and sweeps (the estimate -o path
    is covered by the tests above and benchmarks/replan.py)."""
    runner = CliRunner()
    path = tmp_path / "study.json"
    made = runner.invoke(
        app,
        [
            "plan",
            "-m",
            "ntp-480b",
            "-c",
            "b200-nvl32",
            "-n",
            "32768",
            "--seq-len",
            "16384",
            "--global-batch",
            "1024",
            "--uniform",
            "-o",
            str(path),
            "--json",
        ],
    )
    assert made.exit_code == 0, made.output
    replanned = runner.invoke(app, ["replan", str(path), "--failed-fraction", "0.001", "--seed", "1", "--json"])
    assert replanned.exit_code == 0, replanned.output
    result = json.loads(replanned.stdout)
    assert result["failed_gpus"] == 33 and 0.9 < result["throughput_relative"] < 1.0
    swept = runner.invoke(app, ["sweep", str(path), "--fractions", "0.001", "--samples", "5", "--json"])
    assert swept.exit_code == 0, swept.output
    losses = {r["policy"]: r["mean_loss"] for r in json.loads(swept.stdout)}
    assert losses["ntp-pw"] <= losses["ntp"] <= losses["dp-drop"]


def test_ntp_drops_replicas_below_the_smallest_degree_that_fits_memory():
    """405B at 73 of 77 usable GB: TP7 would need 8/7 of it, so NTP must drop, not shrink."""
    layout = ParallelLayout(
        tp=8, pp=16, dp=64, cp=2, vpp=2, global_batch=2048, sequence_parallel=True, distributed_optimizer=True
    )
    plan = plan_from_layout(
        MODELS["llama3.1-405b"],
        TrainingSpec(seq_len=8192, global_batch=2048),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16384),
        layout,
    )
    replanner = Replanner(plan)
    usable = plan.predicted.hbm_bytes * (1 - plan.headroom)
    scaled = plan.predicted.memory_per_gpu_bytes - plan.predicted.memory_breakdown_bytes["runtime_reserved"]
    assert scaled * replanner.work[7] + 2e9 > usable >= plan.predicted.memory_per_gpu_bytes
    assert replanner.min_degree == 8
    r = replanner.replan(frozenset({5}), "ntp")
    assert [x.status for x in r.replicas].count("dropped") == 1


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["replan", "--failed", "3,40", "--policy", "ntp-pw"], ["--max-power", "1.05"]),
        (["replan", "--failed", "3,40,77,150,201", "--policy", "spares"], ["--spares", "2"]),
        (["replan", "--failed", "3,40", "--policy", "ntp"], ["--batch", "fixed"]),
        (["replan", "--failed-fraction", "0.01", "--seed", "2"], ["--blast", "domain"]),
        (["sweep", "--fractions", "0.01", "--samples", "5", "--policies", "ntp-pw"], ["--max-power", "1.02"]),
        (["sweep", "--fractions", "0.01", "--samples", "5", "--policies", "ntp"], ["--blast", "node"]),
        (["sweep", "--fractions", "0.1", "--samples", "5", "--policies", "dp-drop"], ["--seed", "9"]),
    ],
)
def test_every_replan_option_reaches_the_result(plan_file, command, option):
    runner = CliRunner()
    base = [command[0], str(plan_file), *command[1:], "--json"]
    plain = runner.invoke(app, base)
    changed = runner.invoke(app, [*base, *option])
    assert plain.exit_code == 0 and changed.exit_code == 0, changed.output
    assert json.loads(changed.stdout) != json.loads(plain.stdout)


def test_sweep_validates_max_power(plan_file):
    result = CliRunner().invoke(app, ["sweep", str(plan_file), "--samples", "2", "--max-power", "0.5"])
    assert result.exit_code == 2 and "'--max-power': Input should be greater than or equal to 1" in result.stderr
    with pytest.raises(InputError, match=re.escape("max_power 2.5 must lie in [1, 2.0]")):
        Replanner(Plan.load(plan_file), max_power=2.5)


# ---- in-domain spares: jobs that use part of each NVLink domain ---------------------------------


def nvl72_plan(per_domain=64, gpus=128):
    """SEVEN at tp8 dp16 on gb200-nvl72, 8 sequences per replica: one TP8 group per replica."""
    layout = ParallelLayout(tp=8, dp=gpus // 8, global_batch=gpus, sequence_parallel=True)
    cluster = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=gpus, gpus_per_domain=per_domain)
    return plan_from_layout(SEVEN, TrainingSpec(seq_len=4096, global_batch=gpus), cluster, layout)


def test_idle_gpus_of_a_domain_stand_in_for_failed_ones():
    """64 of 72 GPUs per domain: 8 idle in each, ids 128-135 (domain 0) and 136-143 (domain 1)."""
    replanner = Replanner(nvl72_plan())
    r = replanner.replan(frozenset({3, 10, 17}), "ntp")
    assert (r.throughput_relative, r.in_domain_spares_used, r.degraded_groups) == (1.0, 3, 0)
    assert {x.status for x in r.replicas} == {"healthy"}
    assert (r.rank_to_gpu[3], r.rank_to_gpu[10], r.rank_to_gpu[17]) == (128, 129, 130)
    assert r.rank_to_gpu[:3] == [0, 1, 2] and not {3, 10, 17} & set(r.rank_to_gpu)
    # 9 failures in domain 0: the 8 idle GPUs cover the lowest 8, GPU 60 leaves group 56-63 at TP7
    nine = frozenset({0, 8, 16, 24, 32, 40, 48, 56, 60})
    r = replanner.replan(nine, "ntp")
    assert (r.in_domain_spares_used, r.degraded_groups) == (8, 1)
    assert [x.stage_tp for x in r.replicas if x.status != "healthy"] == [[7]]
    assert replanner.replan(nine, "dp-drop").throughput_relative == 15 / 16


def test_only_the_partial_last_domain_has_spares():
    """128 GPUs of gb200-nvl72 by default: domain 0 uses all 72, domain 1 uses 56 and has 16 idle."""
    r = Replanner(nvl72_plan(per_domain=None)).replan(frozenset({5, 100}), "dp-drop")
    assert (r.in_domain_spares_used, r.degraded_groups, r.throughput_relative) == (1, 1, 15 / 16)
    # packing: healthy groups 1-15 become replicas 0-14, so GPU 100 (group 12, TP rank 4) holds
    # rank 11 * 8 + 4 = 92, on spare 128 now; group 0 is the dropped replica 15
    assert r.rank_to_gpu[92] == 128 and r.rank_to_gpu[120:] == [None] * 8


def test_a_domain_lost_whole_has_no_spares():
    replanner = Replanner(nvl72_plan())
    domain1 = frozenset(range(64, 128))
    whole = replanner.replan(domain1, "dp-drop", domains_down=frozenset({1}))
    assert (whole.in_domain_spares_used, whole.degraded_groups, whole.throughput_relative) == (0, 8, 0.5)
    # as plain failures, the 8 idle GPUs would cover GPUs 64-71 and keep their replica
    assert replanner.replan(domain1, "dp-drop").throughput_relative == 9 / 16
    cluster = replanner.cluster
    assert lost_domains(cluster, domain1, "domain") == {1} and lost_domains(cluster, domain1, "gpu") == set()


def test_random_domain_failures_hit_only_the_jobs_gpus():
    cluster = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128)  # domains of 72 and 56
    seen = {frozenset(random_failures(cluster, 0.5, np.random.default_rng(seed), "domain")) for seed in range(20)}
    assert seen == {frozenset(range(72)), frozenset(range(72, 128))}


def test_cli_replan_reports_in_domain_spares(tmp_path):
    path = tmp_path / "nvl64.json"
    nvl72_plan().save(path)
    runner = CliRunner()
    data = json.loads(runner.invoke(app, ["replan", str(path), "--failed", "3,10,17", "--json"]).stdout)
    assert (data["in_domain_spares_used"], data["throughput_relative"]) == (3, 1.0)
    text = runner.invoke(app, ["replan", str(path), "--failed", "3,10,17"]).stdout
    assert "failed GPUs            3; 0 TP groups degraded after in-domain spares" in text
    assert "in-domain spares used  3 (idle GPUs of the failed GPUs' own NVLink domains)" in text
    blast = runner.invoke(app, ["replan", str(path), "--failed-fraction", "0.5", "--blast", "domain", "--json"])
    assert json.loads(blast.stdout)["in_domain_spares_used"] == 0 and json.loads(blast.stdout)["failed_gpus"] == 64
    full = tmp_path / "full.json"
    two_replicas().save(full)
    assert "in-domain" not in runner.invoke(app, ["replan", str(full), "--failed", "3"]).stdout


def test_sweep_of_domain_blasts_gets_no_in_domain_spares():
    from ntp_planner.failures.sweep import sweep

    # one of the two domains fails whole in every sample: its 8 replicas drop, idle GPUs or not
    rows = sweep(nvl72_plan(), [0.5], 4, ["dp-drop"], np.random.default_rng(0), blast="domain")
    assert (rows[0].mean_loss, rows[0].p5_loss, rows[0].p95_loss) == (0.5, 0.5, 0.5)
    singles = sweep(nvl72_plan(), [8 / 128], 4, ["dp-drop"], np.random.default_rng(0), blast="gpu")
    assert singles[0].p95_loss == 0.0  # 8 single failures: no domain has more than its 8 idle GPUs


# ---- a re-plan file is checked field by field and against its plan ---------------------------------
FROZEN = Path(__file__).parent.parent / "plans"


@pytest.fixture(scope="module")
def frozen_replan():
    """The committed tp8 pp2 dp4 plan and its ntp re-plan of GPUs 3 and 12 (replica 3 at TP 7)."""
    return Plan.load(FROZEN / "ntp_replanned.json"), json.loads((FROZEN / "ntp_replanned.replan.json").read_text())


def _set(data, path, value):
    data = json.loads(json.dumps(data))
    *parents, last = path
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


REPLAN_LIES = [
    (("policy",), "banana", "policy: Input should be 'dp-drop', 'ntp', 'ntp-pw' or 'spares'"),
    (("fallback",), "ntp", "policy ntp with fallback ntp: spares needs a fallback, the other policies none"),
    (("throughput_relative",), math.nan, "throughput_relative: Input should be a finite number"),
    (("throughput_relative",), -0.5, "throughput_relative: Input should be greater than or equal to 0"),
    (("throughput_relative",), 0.5, "throughput_relative 0.5 != global_batch_reached (30) / global_batch_target (32)"),
    (("failed_gpus",), -5, "failed_gpus: Input should be greater than or equal to 0"),
    (("healthy_step_time_s",), -1.0, "healthy_step_time_s: Input should be greater than 0"),
    (("global_batch_reached",), 40, "global_batch_reached 40 exceeds global_batch_target 32"),
    (("paused",), True, "paused is true but batch flexible reaches 30 of 32 sequences"),
    (("replicas", 3, "power", 0), 1e6, "power.0: Input should be less than or equal to 2"),
    (("replicas", 3, "power"), [1.0], "replica 3 gives 1 power multipliers for 2 stages"),
    (("replicas", 0, "power", 0), 1.2, "replica 0 is healthy but runs at power [1.2, 1.0]"),
    (("replicas", 3, "status"), "dropped", "replica 3 is dropped but holds stage_tp [7, 7]"),
    (("rank_to_gpu", 0), -1, "rank_to_gpu.0: Input should be greater than or equal to 0"),
    (("reshard", "time_s"), math.nan, "reshard.time_s: Input should be a finite number"),
    (("reshard", "exposed_s"), -1.0, "reshard.exposed_s: Input should be greater than or equal to 0"),
    (("reshard", "exposed_s"), 1e300, "+ exposed_s (1e+300) != time_s"),
    (("policy",), "dp-drop", "replica 3 is degraded but dp-drop decided the replicas"),
    (("replicas", 3, "power", 0), 0.1, "replica 3 runs at power [0.1, 1.0] but ntp runs every GPU at power 1.0"),
]


@pytest.mark.parametrize(("path", "value", "message"), REPLAN_LIES)
def test_a_re_plan_file_refuses_values_no_re_plan_has(frozen_replan, path, value, message):
    from pydantic import ValidationError

    from ntp_planner.replan_result import ReplanResult
    from topologies.cluster_catalogue import first_error

    with pytest.raises(ValidationError) as err:
        ReplanResult.model_validate(_set(frozen_replan[1], path, value))
    assert message in first_error(err.value), first_error(err.value)


REPLAN_MISMATCHES = [
    # replica 3 runs stage 0 at TP 7 on ranks 24..30; rank 31 (its TP rank 7) must stay empty
    (("rank_to_gpu", 31), 3, "replica 3 runs stage 0 at TP 7 but rank_to_gpu gives rank 31 (TP rank 7 or more) a GPU"),
    (
        ("replicas", 0, "gpus_used"),
        15,
        "replica 0 has gpus_used 15 and gpus_idle 0 but rank_to_gpu places 16 of its 16",
    ),
    (("replicas", 3, "local_batch"), 9, "replica 3 runs local_batch 9; it must be at most the plan's 8 sequences"),
    (("idle_gpus",), [0], "idle_gpus lists GPU(s) [0] that run ranks"),
    (("failed_gpus",), 65, "with 65 failed GPUs but the plan runs 32 on 64 GPUs"),
    (("plan_hash",), "0" * 64, "the re-plan was made for another plan (plan_hash 000000000000..., this plan's"),
    (("healthy_step_time_s",), 1e300, "healthy_step_time_s 1e+300 is not the plan's predicted step_time_s"),
]


@pytest.mark.parametrize(("path", "value", "message"), REPLAN_MISMATCHES)
def test_a_re_plan_must_match_the_plan_it_came_from(frozen_replan, path, value, message):
    from ntp_planner.replan_result import ReplanResult

    plan, data = frozen_replan
    ReplanResult.model_validate(data).check_against(plan)  # the committed pair agrees
    result = ReplanResult.model_validate(_set(data, path, value))
    with pytest.raises(InputError) as err:
        result.check_against(plan)
    assert message in str(err.value) and "ntp replan PLAN -o R.json" in str(err.value), str(err.value)


def test_a_re_plan_of_another_plan_of_the_same_shape_is_refused(frozen_replan, tmp_path):
    """Same layout and cluster, another sequence length: every count matches, only the hash tells."""
    plan, data = frozen_replan
    other = plan_from_layout(
        plan.model, plan.training.model_copy(update={"seq_len": 2048}), plan.cluster.build(), plan.layout
    )
    (tmp_path / "other.json").write_text(other.model_dump_json())
    (tmp_path / "r.json").write_text(json.dumps(data))
    result = CliRunner().invoke(
        app, ["export", str(tmp_path / "other.json"), "--replan", str(tmp_path / "r.json"), "-o", str(tmp_path / "x")]
    )
    assert result.exit_code == 2 and "the re-plan was made for another plan" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_fresh_re_plan_carries_its_plan_hash_and_passes_its_own_check():
    plan = two_replicas()
    result = Replanner(plan).replan(frozenset({3}), "ntp")
    assert result.plan_hash == plan.inputs_hash
    again = type(result).model_validate_json(result.model_dump_json())  # what `ntp replan -o` writes, re-read
    again.check_against(plan)
