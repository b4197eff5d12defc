"""The goodput simulator against closed forms: M/G/inf, Meta's ETTR, Daly, Poisson counts."""

import json
import math
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.cli import app
from ntp_planner.failures.checkpoint_interval import meta_ettr
from ntp_planner.failures.events import draw_events, failed_counts
from ntp_planner.failures.sim_config import LLAMA3_RATE_PER_GPU_HOUR, SimConfig
from ntp_planner.failures.simulator import simulate
from ntp_planner.failures.tables import ThroughputTables
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster
from topologies.errors import InputError


@pytest.fixture(scope="module")
def plan_16k():
    # full recompute leaves memory for reduced TP (down to TP3); the fastest layout, at 65 of 72
    # usable GB, could not run a replica at TP7 and NTP would fall back to dropping it
    layout = ParallelLayout(
        tp=8,
        pp=16,
        dp=64,
        cp=2,
        vpp=2,
        global_batch=2048,
        sequence_parallel=True,
        distributed_optimizer=True,
        recompute="full",
    )
    return plan_from_layout(
        MODELS["llama3.1-405b"],
        TrainingSpec(seq_len=8192, global_batch=2048),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16384),
        layout,
    )


def test_mean_failed_share_is_rate_times_mean_repair():
    cfg = SimConfig(days=30, trials=300, failure_rate_per_gpu_hour=1e-4)
    n = 4096
    ev = draw_events(cfg, n, 8, np.random.default_rng(3))
    down = failed_counts(ev, cfg.trials, 4320, 30 * 24 / 4320)
    per_trial = down.mean(axis=1) / n
    # M/G/inf: arrival rate x mean service = 1e-4 x (0.78 x (72 + 120) / 2 + 0.22 x 3) = 1e-4 x 75.54
    expected = 7.554e-3
    assert cfg.mean_repair_h == pytest.approx(75.54)
    assert abs(per_trial.mean() - expected) < 4 * per_trial.std() / math.sqrt(cfg.trials)


def test_restart_ettr_matches_metas_closed_form(plan_16k):
    cfg = SimConfig(days=30, trials=300, checkpoint_write_s=30, restart_s=600, detection_s=0)
    results, _ = simulate(plan_16k, cfg, ["restart"], np.random.default_rng(11))
    r = results["restart"]
    job_rate_per_s = LLAMA3_RATE_PER_GPU_HOUR * 16384 / 3600
    closed = meta_ettr(job_rate_per_s, 600, r.checkpoint_interval_s, 30)  # pinned in test_checkpoint
    assert r.mean.ettr == pytest.approx(closed, rel=0.02)


def test_auto_interval_is_dalys(plan_16k):
    cfg = SimConfig(days=2, trials=2)
    results, _ = simulate(plan_16k, cfg, ["restart", "ntp"], np.random.default_rng(0))
    # job MTBF = 54 x 24 x 3,600 / 419 = 11,135 s; Daly for a 300 s write: 2,388.64 s (test_checkpoint)
    for r in results.values():
        assert r.checkpoint_interval_s == pytest.approx(2388.64, abs=0.01)


def test_llama3_interruption_count_is_poisson(plan_16k):
    cfg = SimConfig(days=54, trials=100)
    results, _ = simulate(plan_16k, cfg, ["restart"], np.random.default_rng(5))
    mean = LLAMA3_RATE_PER_GPU_HOUR * 16384 * 54 * 24
    assert mean == pytest.approx(419)
    single, _ = simulate(plan_16k, cfg.model_copy(update={"trials": 1}), ["restart"], np.random.default_rng(5))
    assert abs(single["restart"].mean.interruptions - mean) <= 2 * math.sqrt(mean)
    assert abs(results["restart"].mean.interruptions - mean) <= 2 * math.sqrt(mean / 100)


def test_same_seed_same_result_bit_for_bit(plan_16k):
    cfg = SimConfig(days=10, trials=150)
    a, _ = simulate(plan_16k, cfg, ["restart", "ntp", "ntp-pw"], np.random.default_rng(42))
    b, _ = simulate(plan_16k, cfg, ["restart", "ntp", "ntp-pw"], np.random.default_rng(42))
    assert {k: v.model_dump() for k, v in a.items()} == {k: v.model_dump() for k, v in b.items()}
    c, _ = simulate(plan_16k, cfg, ["ntp"], np.random.default_rng(43))
    assert c["ntp"].mean != a["ntp"].mean


def test_strategies_rank_as_the_ntp_study_finds(plan_16k):
    results, _ = simulate(
        plan_16k, SimConfig(days=30, trials=100), ["restart", "dp-drop", "ntp", "ntp-pw"], np.random.default_rng(1)
    )
    cap = {k: v.mean.capacity_goodput for k, v in results.items()}
    assert cap["ntp-pw"] >= cap["ntp"] > cap["dp-drop"] > cap["restart"]
    assert results["dp-drop"].mean.idle_gpu_hours > results["ntp"].mean.idle_gpu_hours


def test_fixed_batch_pauses_and_spares_unpause(plan_16k):
    cfg = SimConfig(days=10, trials=50, batch="fixed")
    results, _ = simulate(plan_16k, cfg, ["dp-drop", "ntp-pw"], np.random.default_rng(2))
    assert results["dp-drop"].mean.hours_paused > 100  # some GPU is nearly always down at 16K GPUs
    # ntp-pw pauses only when two failures hit one DGX: TP6 holds 22 of 128 heads instead of 16
    # (1.375x the work), more than a 1.3x power cap buys (1.16x speed)
    pw, drop = results["ntp-pw"].mean, results["dp-drop"].mean
    assert pw.hours_paused < drop.hours_paused / 5 and pw.spares_needed < drop.spares_needed / 5
    need = int(results["dp-drop"].p95.spares_needed)
    spared, _ = simulate(plan_16k, cfg.model_copy(update={"spares": need + 10}), ["spares"], np.random.default_rng(2))
    assert spared["spares"].mean.hours_paused < results["dp-drop"].mean.hours_paused / 10


@pytest.fixture()
def plan_file(tmp_path, plan_16k):
    path = tmp_path / "plan.json"
    plan_16k.save(path)
    return path


def test_cli_simulate_json_and_plots(plan_file, tmp_path):
    out = tmp_path / "plots"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            str(plan_file),
            "--days",
            "5",
            "--trials",
            "20",
            "--strategies",
            "restart,ntp",
            "--plot",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for name in ("restart", "ntp"):
        assert {"goodput", "capacity_goodput", "ettr", "throughput_loss", "hours_paused", "spares_needed"} <= set(
            data[name]
        )
    pngs = sorted(p.name for p in out.iterdir())
    assert pngs == ["failed_fraction.png", "goodput_distribution.png", "throughput_over_time.png"]
    for p in out.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_cli_plot_without_matplotlib(plan_file, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    result = CliRunner().invoke(app, ["simulate", str(plan_file), "--trials", "2", "--plot", str(tmp_path / "x")])
    assert result.exit_code == 2 and "pip install 'ntp-planner[plot]'" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--failure-rate", "-1"], "Invalid value for '--failure-rate': Input should be greater than or equal to 0"),
        (["--failure-rate", "1e-320"], "--failure-rate 1e-320: a rate of 1e-320 per GPU-hour is below 1e-12"),
        (["--weibull-shape", "1e-320"], "Invalid value for '--weibull-shape': Input should be greater than or equal"),
        (["--lemon-fraction", "1"], "Invalid value for '--lemon-fraction': Input should be less than or equal to 0.99"),
        (["--days", "0"], "--days 0.0: Input should be greater than 0"),
        (["--strategies", "restart,magic"], "--strategies 'restart,magic': magic is not one of restart, dp-drop,"),
        (["--hw-repair-days", "-3"], "each in 0..365 (a year)"),
        (["--hw-repair-days", "3-inf"], "each in 0..365 (a year)"),
        (["--sw-repair-hours", "9000"], "each in 0..8760 (a year)"),
        (["--hw-repair-days", "5-3"], "is reversed"),
        (["--checkpoint-interval", "soon"], "must be auto or minutes"),
        (["--trials", "0"], "trials"),
    ],
)
def test_cli_simulate_bad_input(plan_file, args, message):
    result = CliRunner().invoke(app, ["simulate", str(plan_file), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


def test_goodput_objective_ranks_by_effective_throughput(tmp_path):
    from ntp_planner.solver.planner import make_plan

    args = (
        MODELS["llama3-70b"],
        TrainingSpec(seq_len=8192, global_batch=512),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=512),
    )
    plan = make_plan(*args, per_layer=False, objective="goodput", strategy="dp-drop", candidates=4)
    ranking = plan.goodput_ranking
    assert len(ranking) == 4 and plan.goodput_strategy == "dp-drop"
    assert [e.effective_tokens_per_s for e in ranking] == sorted(
        (e.effective_tokens_per_s for e in ranking), reverse=True
    )
    assert all(e.effective_tokens_per_s == pytest.approx(e.tokens_per_s * e.capacity_goodput) for e in ranking)
    assert plan.layout == ranking[0].layout  # the plan is the goodput winner
    again = make_plan(*args, per_layer=False, objective="goodput", strategy="dp-drop", candidates=4, seed=0)
    assert again.goodput_ranking == ranking  # seeded by the caller (0 by default)
    other = make_plan(*args, per_layer=False, objective="goodput", strategy="dp-drop", candidates=4, seed=1)
    assert [e.capacity_goodput for e in other.goodput_ranking] != [e.capacity_goodput for e in ranking]
    path = tmp_path / "g.json"
    plan.save(path)
    explained = json.loads(CliRunner().invoke(app, ["explain", str(path), "--json"]).stdout)
    assert explained["objective"] == "goodput" and len(explained["goodput_ranking"]) == 4
    text = CliRunner().invoke(app, ["explain", str(path)]).stdout
    assert "Ranked by throughput under failures" in text and "Runners-up" in text
    with pytest.raises(ValueError, match="strategy 'magic'"):
        make_plan(*args, per_layer=False, objective="goodput", strategy="magic")
    with pytest.raises(ValueError, match="objective 'speed'"):
        make_plan(*args, per_layer=False, objective="speed")


def test_weibull_arrivals_keep_the_mean_rate_and_are_burstier(plan_16k):
    cfg = SimConfig(days=30, trials=300, distribution="weibull", weibull_shape=0.5)
    ev = draw_events(cfg, 16384, 8, np.random.default_rng(4))
    counts = np.bincount(ev.trial[ev.start_h >= 0], minlength=cfg.trials)
    mean = LLAMA3_RATE_PER_GPU_HOUR * 16384 * 30 * 24
    assert counts.mean() == pytest.approx(mean, rel=0.05)
    assert counts.var() > 1.5 * counts.mean()  # a Poisson count has variance = mean


def test_blast_radius_and_stragglers_cost_throughput(plan_16k):
    base = SimConfig(days=10, trials=60)
    gpu, _ = simulate(plan_16k, base, ["ntp"], np.random.default_rng(8))
    hw_domain = (base.classes[0].model_copy(update={"blast": "domain"}), base.classes[1])
    domain, _ = simulate(plan_16k, base.model_copy(update={"classes": hw_domain}), ["ntp"], np.random.default_rng(8))
    # a lost DGX is a lost TP group: NTP cannot shrink it, so whole replicas (1/64 each) drop
    assert domain["ntp"].mean.capacity_goodput < gpu["ntp"].mean.capacity_goodput - 0.005
    assert domain["ntp"].mean.idle_gpu_hours > 5 * gpu["ntp"].mean.idle_gpu_hours
    assert domain["ntp"].mean.time_over_threshold >= gpu["ntp"].mean.time_over_threshold
    slow_cfg = base.model_copy(
        update={"straggler_rate_per_gpu_hour": 2e-5, "straggler_hours": 0.4, "straggler_slowdown": 2.0}
    )
    slow, _ = simulate(plan_16k, slow_cfg, ["ntp"], np.random.default_rng(8))
    # episodes arrive ~0.33 per hour and last 0.4 h: busy ~1 - exp(-0.13) of the time, at half speed
    busy = 1 - math.exp(-2e-5 * 16384 * 0.4)
    drop = gpu["ntp"].mean.capacity_goodput - slow["ntp"].mean.capacity_goodput
    assert drop == pytest.approx(gpu["ntp"].mean.capacity_goodput * busy * 0.5, rel=0.25)


def test_down_threshold_is_the_users(plan_file):
    def share_over(threshold):
        args = [
            "simulate",
            str(plan_file),
            "--days",
            "3",
            "--trials",
            "10",
            "--strategies",
            "ntp",
            "--down-threshold",
            threshold,
            "--json",
        ]
        return json.loads(CliRunner().invoke(app, args).stdout)["ntp"]["time_over_threshold"]

    assert share_over("0.5") == 0.0 and share_over("0") > 0.9


@pytest.mark.parametrize(
    "option",
    [
        ["--failure-dist", "weibull", "--weibull-shape", "0.4"],
        ["--straggler-rate", "1e-4", "--straggler-slowdown", "2"],
        ["--hw-blast", "domain"],
        ["--lemon-fraction", "0.1", "--lemon-factor", "20"],
    ],
)
def test_every_failure_option_reaches_the_simulation(plan_file, option):
    runner = CliRunner()
    base = ["simulate", str(plan_file), "--days", "5", "--trials", "30", "--strategies", "ntp", "--json"]
    plain = json.loads(runner.invoke(app, base).stdout)["ntp"]
    changed = runner.invoke(app, [*base, *option])
    assert changed.exit_code == 0, changed.output
    assert json.loads(changed.stdout)["ntp"] != plain


def _nvl72_plan(per_domain):
    """llama3-8b at tp8 dp16 on 128 GB200s, 8 sequences per replica."""
    layout = ParallelLayout(tp=8, dp=16, global_batch=128, sequence_parallel=True, distributed_optimizer=True)
    cluster = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128, gpus_per_domain=per_domain)
    return plan_from_layout(MODELS["llama3-8b"], TrainingSpec(seq_len=4096, global_batch=128), cluster, layout)


STRATEGIES = ["restart", "dp-drop", "spares", "ntp", "ntp-pw"]


@pytest.mark.parametrize(
    ("interval_s", "kept_s"),
    [
        # a day of cycles of 3,000 + 300 s: 26 (78,000 s of work) and 600 s, 300 s of work then the final write
        (3000.0, 78_300),
        # auto without failures: the whole run as the interval, one checkpoint at the end
        (None, 86_400 - 300),
    ],
)
def test_every_strategy_keeps_whole_cycles_and_the_final_checkpoint_without_failures(interval_s, kept_s):
    cfg = SimConfig(days=1, trials=3, failure_rate_per_gpu_hour=0, checkpoint_interval_s=interval_s)
    results, _ = simulate(_nvl72_plan(None), cfg, STRATEGIES, np.random.default_rng(0))
    for name, r in results.items():
        for stats in (r.mean, r.p5, r.p95):
            assert stats.goodput == pytest.approx(kept_s / 86_400, rel=1e-12), name
            assert stats.capacity_goodput == pytest.approx(kept_s / 86_400, rel=1e-12), name


def test_in_domain_spares_cover_failures_up_to_the_idle_gpus():
    """64 of 72 GPUs per domain: 8 idle GPUs in each of the 2 domains, 8 TP8 groups per domain."""
    tables = ThroughputTables(_nvl72_plan(64), SimConfig())
    assert tables.get("dp-drop", "flexible", (1, 0, 0, 1)) == (1.0, 0)  # a GPU, a pair: covered
    assert tables.get("dp-drop", "flexible", (0, 2, 0, 0)) == (1.0, 0)  # a 4-GPU tray in each domain
    assert tables.get("dp-drop", "flexible", (0, 0, 1, 0)) == (0.5, 0)  # a domain takes its idle GPUs too
    full = ThroughputTables(_nvl72_plan(None), SimConfig())  # 72 and 56 GPUs: only domain 1 has spares (16)
    # the single lands in domain 0: its replica drops and leaves 7 healthy GPUs idle
    assert full.get("dp-drop", "flexible", (1, 0, 0, 0)) == (15 / 16, 7)
    assert full.get("dp-drop", "flexible", (0, 0, 0, 2)) == (15 / 16, 6)  # the second pair is covered


def test_single_gpu_failures_cost_only_the_stalls_with_in_domain_spares():
    cfg = SimConfig(days=30, trials=50, failure_rate_per_gpu_hour=1e-4)
    spared, _ = simulate(_nvl72_plan(64), cfg, ["dp-drop", "restart"], np.random.default_rng(4))
    r = spared["dp-drop"].mean
    # throughput stays 1 between failures: capacity goodput is time goodput, no idle GPUs
    assert r.capacity_goodput == pytest.approx(r.goodput, rel=1e-12) and r.idle_gpu_hours == 0
    assert spared["restart"].mean.spares_needed == 0  # pairs and trays fit in 8 idle GPUs too
    bare, _ = simulate(_nvl72_plan(None), cfg, ["dp-drop"], np.random.default_rng(4))
    assert bare["dp-drop"].mean.capacity_goodput < bare["dp-drop"].mean.goodput


@pytest.mark.parametrize(
    ("update", "message"),
    [
        # 30 days of 1-second bins: 2,592,000 bins per trial
        ({"bin_s": 1}, "days(30) x 86400 / bin_s(1) = 2,592,000 time bins per trial is over the 200,000"),
        # 10**6 trials (the bound) x 4,320 bins
        ({"trials": 10**6}, "trials(1,000,000) x bins(4,320) = 4.32e+09 trial-bins"),
        ({"trials": 10**6 + 1}, "Input should be less than or equal to 1000000"),
        ({"checkpoint_write_s": 0}, "checkpoint_write_s\n  Input should be greater than 0"),
        ({"failure_rate_per_gpu_hour": 1e-320}, "a rate of 1e-320 per GPU-hour is below 1e-12"),
        ({"days": float("inf")}, "finite number"),
        ({"failure_rate_per_gpu_hour": float("nan")}, "finite number"),
    ],
)
def test_config_refuses_work_beyond_the_bounds(update, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SimConfig(**update)


def test_simulate_refuses_runs_of_hours_with_the_arithmetic(plan_16k):
    rng = np.random.default_rng(0)
    # 1 failure per GPU-hour (the bound) x (720 + 120 h) x 16,384 GPUs = 1.38e7 events per trial
    with pytest.raises(InputError, match=re.escape("= 1.38e+07 events per trial is over 5,000")):
        simulate(plan_16k, SimConfig(failure_rate_per_gpu_hour=1.0), ["ntp"], rng)
    # Llama 3's rate: 16,384 x 840 h x 1.97e-5 = 271 per trial, x 300,000 trials = 8.1e7 > 5.4e7
    with pytest.raises(InputError, match=re.escape("x trials(300,000) = 8.15e+07 is over 5.4e+07")):
        simulate(plan_16k, SimConfig(days=30, trials=300_000), ["ntp"], rng)
    # 100,000 trials x 4,320 bins x 5 strategies = 2.16e9 is allowed, 6 strategies' worth is not
    with pytest.raises(InputError, match=re.escape("x strategies(5) = 2.59e+09 trial-bins")):
        simulate(plan_16k, SimConfig(days=36, trials=100_000), ["restart", "dp-drop", "spares", "ntp", "ntp-pw"], rng)


def test_results_are_pinned_for_a_seed():
    """Refactors must keep every draw in its order: these figures come from the simulator as it
    stood before it was split into events, states and goodput (10 days, 40 trials, seed 7); restart's
    since it became a renewal process (failures inside a recovery join it); both goodputs since every
    strategy keeps only checkpointed work, with a final checkpoint at the end (renewal.kept_work_s);
    ntp's since a state counts every single-GPU failure of a domain (18 of its 57,600 trial-bins hold
    three in one domain, which had counted as two singles and a pair)."""
    results, trace = simulate(
        _nvl72_plan(None), SimConfig(days=10, trials=40), ["restart", "ntp"], np.random.default_rng(7)
    )
    assert results["restart"].mean.goodput == PINNED["restart"]
    assert results["ntp"].mean.capacity_goodput == PINNED["ntp"]
    assert trace.failed_fraction.sum() == PINNED["failed"]


PINNED = {"restart": 0.9769396047922448, "ntp": 0.9879085319236474, "failed": 4.3828125}


def test_sweep_refuses_samples_beyond_the_bound(plan_16k):
    from ntp_planner.failures.sweep import sweep

    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match=re.escape("samples(1,000,000,000) x fractions(2) x policies(1) = 2,000,")):
        sweep(plan_16k, [0.001, 0.002], 10**9, ["ntp"], rng)
    with pytest.raises(InputError, match=re.escape("fractions must be failed shares in [0, 1); got [nan]")):
        sweep(plan_16k, [float("nan")], 1, ["ntp"], rng)
    with pytest.raises(InputError, match="samples 0 must be at least 1"):
        sweep(plan_16k, [0.001], 0, ["ntp"], rng)
