"""`ntp simulate` options of the spares pool, the start and measured recovery costs: hand-derived
numbers and brute force on small runs."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.cli import app
from ntp_planner.failures.events import draw_events, failed_counts
from ntp_planner.failures.sim_config import SimConfig
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster

BASE = ["--days", "4", "--trials", "12", "--strategies", "restart,ntp", "--json"]


@pytest.fixture(scope="module")
def plan_4k(tmp_path_factory):
    """ntp-480b on 4,096 B200 in NVL32 domains, TP32 x PP8 x DP16, 8 sequences a replica."""
    path = tmp_path_factory.mktemp("sim") / "plan.json"
    layout = ParallelLayout(
        tp=32, pp=8, dp=16, global_batch=128, sequence_parallel=True, distributed_optimizer=True, recompute="full"
    )
    training = TrainingSpec(seq_len=16384, global_batch=128)
    plan_from_layout(MODELS["ntp-480b"], training, Cluster(spec=CLUSTERS["b200-nvl32"], num_gpus=4096), layout).save(
        path
    )
    return path


def simulate(plan, *args):
    result = CliRunner().invoke(app, ["simulate", str(plan), *BASE, *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_healthy_start_has_no_failure_at_t0_and_reaches_the_steady_share():
    n, rate = 4096, 1e-4
    healthy = SimConfig(days=15, trials=200, failure_rate_per_gpu_hour=rate, start="healthy")
    ev = draw_events(healthy, n, 8, np.random.default_rng(1))
    assert ev.start_h.min() > 0 and healthy.warm_h == 0  # nothing is down at t = 0
    down = failed_counts(ev, healthy.trials, 360, 1.0) / n  # hourly bins
    # M/G/inf from empty: at t, rate x E[min(repair, t)]; from the longest repair (120 h) on, rate x mean repair
    steady = rate * healthy.mean_repair_h  # 1e-4 x 75.54 h
    late = down[:, 150:].mean(axis=1)
    assert abs(late.mean() - steady) < 4 * late.std() / math.sqrt(healthy.trials)
    # after 24 h: software repairs (3 h) are in steady state, hardware ones (72-120 h) have all been down since
    # they began: 1e-4 x (0.22 x 3 + 0.78 x 24) = 1.938e-3
    day = down[:, 24]
    assert abs(day.mean() - 1.938e-3) < 4 * day.std() / math.sqrt(healthy.trials)
    steady_cfg = healthy.model_copy(update={"start": "steady"})
    at_zero = failed_counts(draw_events(steady_cfg, n, 8, np.random.default_rng(1)), 200, 360, 1.0)[:, 0] / n
    assert abs(at_zero.mean() - steady) < 4 * at_zero.std() / math.sqrt(200)


def test_cli_start_healthy_reports_less_time_down(plan_4k):
    steady = simulate(plan_4k)
    healthy = simulate(plan_4k, "--start", "healthy")
    assert healthy["settings"]["start"] == "healthy" and steady["settings"]["start"] == "steady"
    # 4 days from healthy: hardware failures pile up from 0, so less is down than in steady state
    assert healthy["ntp"]["time_over_threshold"] <= steady["ntp"]["time_over_threshold"]
    assert healthy["ntp"]["capacity_goodput"] > steady["ntp"]["capacity_goodput"]


def test_spares_sweep_runs_every_pool_on_the_same_failures(plan_4k):
    sweep = simulate(plan_4k, "--spares", "0,8", "--batch", "fixed")
    rows = {(r["spares"], r["strategy"]): r for r in sweep["spares_sweep"]}
    assert sorted(rows) == [(0, "ntp"), (0, "restart"), (8, "ntp"), (8, "restart")]
    single = simulate(plan_4k, "--spares", "8", "--batch", "fixed")["ntp"]
    assert rows[8, "ntp"]["capacity_goodput"] == single["capacity_goodput"]  # same seed, same failures
    # 8 spare domains of 32 GPUs on 4,096: per-GPU throughput is capacity goodput x 4,096 / 4,352
    assert rows[8, "ntp"]["gpu_throughput"] == pytest.approx(single["capacity_goodput"] * 4096 / 4352, rel=1e-12)
    assert rows[8, "ntp"]["spare_gpus"] == 256
    # a fixed batch: without spares NTP pauses whenever a GPU is down; one replica's worth (8) of spares and it
    # needs p95 of at most 8, so it pauses far less
    assert rows[0, "ntp"]["hours_paused"] > 10 * rows[8, "ntp"]["hours_paused"]
    assert rows[8, "restart"]["goodput"] == rows[0, "restart"]["goodput"]  # restart does not draw on the pool


def test_spares_sweep_plot(plan_4k, tmp_path):
    pytest.importorskip("matplotlib")
    args = ["simulate", str(plan_4k), "--days", "2", "--trials", "4", "--spares", "0,4", "--plot", str(tmp_path / "p")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    png = tmp_path / "p" / "spares.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plot written to" in result.stdout
    assert "per-GPU throughput" in result.stdout


def test_recovery_costs_come_from_the_file_unless_given_on_the_command_line(plan_4k, tmp_path):
    measured = tmp_path / "validate.json"
    measured.write_text(json.dumps({"passed": True, "recovery_costs_s": {"detection_s": 2.5, "restart_s": 95}}))
    used = simulate(plan_4k, "--recovery-from", measured)["settings"]
    assert used["recovery_costs_s"] == {"detection_s": 2.5, "reconfigure_s": 180.0, "restart_s": 95.0}
    assert used["recovery_sources"] == {"detection_s": "file", "reconfigure_s": "default", "restart_s": "file"}
    cli = simulate(plan_4k, "--recovery-from", measured, "--restart-s", "300")["settings"]
    assert cli["recovery_costs_s"]["restart_s"] == 300.0 and cli["recovery_sources"]["restart_s"] == "command line"
    # the costs reach the simulation: restart and detection cost 97.5 s a failure instead of 660 s
    assert (
        simulate(plan_4k, "--recovery-from", measured)["restart"]["goodput"] > simulate(plan_4k)["restart"]["goodput"]
    )
    text = CliRunner().invoke(
        app, ["simulate", str(plan_4k), "--days", "1", "--trials", "2", "--recovery-from", measured]
    )
    assert "detection 2.5 s (file), restart 95 s (file), reconfigure 180 s;" in " ".join(text.stdout.split())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "is not valid JSON"),
        ("[1]", "must hold a mapping"),
        ('{"passed": true}', 'needs an object "recovery_costs_s"'),
        ('{"recovery_costs_s": {"restart": 5}}', "names recovery costs ['restart']; the simulator takes detection_s"),
        ('{"recovery_costs_s": {"restart_s": -1}}', "restart_s is -1; it must be a finite number of seconds"),
        ('{"recovery_costs_s": {"detection_s": NaN}}', "detection_s is nan"),
        ('{"recovery_costs_s": {"reconfigure_s": "3"}}', "reconfigure_s is '3'"),
        ('{"recovery_costs_s": {"reconfigure_s": true}}', "reconfigure_s is True"),
    ],
)
def test_bad_recovery_files_are_one_sentence(plan_4k, tmp_path, content, message):
    bad = tmp_path / "r.json"
    bad.write_text(content)
    result = CliRunner().invoke(app, ["simulate", str(plan_4k), "--trials", "1", "--recovery-from", str(bad)])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_oversized_recovery_file_is_refused(plan_4k, tmp_path, monkeypatch):
    from ntp_planner.failures import recovery_costs

    monkeypatch.setattr(recovery_costs, "MAX_RECOVERY_BYTES", 100)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"recovery_costs_s": {}, "log": "x" * 200}))
    result = CliRunner().invoke(app, ["simulate", str(plan_4k), "--trials", "1", "--recovery-from", str(big)])
    assert result.exit_code == 2 and "more than the 100 a recovery file can need" in result.stderr


@pytest.mark.parametrize(
    ("spares", "message"),
    [
        ("-8", "--spares -8: Input should be greater than or equal to 0"),
        ("0,-8", "--spares -8 is outside 0..1,000,000"),
        ("0,1000001", "--spares 1,000,001 is outside 0..1,000,000"),
        ("0,x", "--spares"),
        ("4,4", "lists 2 pool sizes; give at most 32, each once"),
        (",".join(map(str, range(33))), "lists 33 pool sizes"),
    ],
)
def test_bad_spares_lists(plan_4k, spares, message):
    result = CliRunner().invoke(app, ["simulate", str(plan_4k), "--trials", "1", "--spares", spares])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
