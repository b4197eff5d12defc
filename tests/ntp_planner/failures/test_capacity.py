"""The capacity planner (`ntp capacity`, issue 26): time to train against closed forms, cost
arithmetic by hand, and the pruned, shared search against simulating every candidate."""

import numpy as np
import pytest

from cost_models import TrainingSpec, resolve_model
from ntp_planner.failures import capacity_sim as sim
from ntp_planner.failures.capacity import search
from ntp_planner.failures.capacity_job import Job, plan_grid, train_hours
from ntp_planner.failures.capacity_spec import CapacitySpec
from ntp_planner.failures.renewal import renewal_goodput
from ntp_planner.failures.sim_config import SimConfig
from topologies import resolve_cluster_spec

CLUSTERS = {name: resolve_cluster_spec(name) for name in ("dgx-h100", "gb200-nvl72")}
DOMAINS = {name: spec.domain_size for name, spec in CLUSTERS.items()}
PRICES = {"dgx-h100": 49.24 / 8, "gb200-nvl72": 42.00 / 4}  # topologies.prices, by hand


# a grid small enough to simulate whole, with failures enough (1e-3 per GPU-hour) to separate candidates
SEARCH = CapacitySpec(
    tokens=1.2e11,
    deadline_days=1.5,
    confidence=0.8,
    gpus=(64, 128, 256),
    spares=(0, 1),
    strategies=("restart", "dp-drop", "ntp"),
    trials=16,
    seed=7,
    sim=SimConfig(failure_rate_per_gpu_hour=1e-3),
)


@pytest.fixture(scope="module")
def plans():
    model = resolve_model("llama3-8b")
    return plan_grid(model, TrainingSpec(seq_len=4096, global_batch=256), CLUSTERS, (64, 128, 256))


def _job(plans, cluster="dgx-h100", gpus=64):
    return Job(cluster, gpus, DOMAINS[cluster], plans[(cluster, gpus)])


@pytest.mark.parametrize("strategy", ["restart", "dp-drop", "ntp"])
def test_a_failure_free_run_trains_in_tokens_over_throughput(plans, strategy):
    spec = CapacitySpec(
        tokens=3e10, deadline_days=30, confidence=0.9, gpus=(64,), trials=3, sim=SimConfig(failure_rate_per_gpu_hour=0)
    )
    job = _job(plans)
    pool = sim.EventPool(spec.sim, spec.trials, 64, seed=0)
    hours = train_hours(spec, pool, job, 0, strategy)
    expected = 3e10 / job.plan.predicted.tokens_per_s / 3600
    assert hours == pytest.approx(np.full(3, expected), rel=1e-12)


def test_cost_pays_for_spares_and_whole_nvlink_domains(plans):
    """No failures, so the time is tokens / throughput; dgx-h100: 64 GPUs + 2 spare domains of 8 =
    80 GPUs paid; gb200-nvl72: 64 GPUs fill one 72-GPU domain, + 1 spare domain = 144 GPUs."""
    spec = CapacitySpec(
        tokens=3e10,
        deadline_days=30,
        confidence=0.5,
        gpus=(64,),
        spares=(2,),
        strategies=("ntp",),
        trials=2,
        sim=SimConfig(failure_rate_per_gpu_hour=0),
    )
    one = {k: plans[k] for k in [("dgx-h100", 64)]}
    c = search(spec, one, DOMAINS, PRICES).cheapest
    hours = 3e10 / plans[("dgx-h100", 64)].predicted.tokens_per_s / 3600
    assert c.paid_gpus == 80 and c.gpu_hours == pytest.approx(80 * hours)
    assert c.cost_usd == pytest.approx(80 * hours * 6.155) and c.cost_usd_p90 == pytest.approx(c.cost_usd)
    spec = spec.model_copy(update={"spares": (1,)})
    c = search(spec, {("gb200-nvl72", 64): plans[("gb200-nvl72", 64)]}, DOMAINS, PRICES).cheapest
    hours = 3e10 / plans[("gb200-nvl72", 64)].predicted.tokens_per_s / 3600
    assert c.paid_gpus == 144 and c.cost_usd == pytest.approx(144 * hours * 10.5)


def test_restart_trains_at_the_renewal_goodput(plans):
    """Checkpoint-restart's mean time to train over a long run is work / renewal goodput (closed
    form, ntp_planner.failures.renewal): 64 GPUs at 1e-3 failures per GPU-hour, ~64 failures a trial."""
    cfg = SimConfig(failure_rate_per_gpu_hour=1e-3)
    job = _job(plans)
    work_s = 1000 * 3600
    spec = CapacitySpec(tokens=work_s * job.plan.predicted.tokens_per_s, deadline_days=3650, confidence=0.5,
                        gpus=(64,), trials=200, sim=cfg)  # fmt: skip
    hours = train_hours(spec, sim.EventPool(cfg, spec.trials, 64, seed=1), job, 0, "restart")
    from ntp_planner.failures.capacity_job import checkpoint_interval

    interval, _ = checkpoint_interval(spec, 64)
    good = renewal_goodput(64e-3 / 3600, interval, cfg.checkpoint_write_s, cfg.detection_s + cfg.restart_s)
    assert hours.mean() == pytest.approx(work_s / good / 3600, rel=0.01)


def test_elastic_trains_at_the_simulators_capacity_goodput(plans):
    """An elastic strategy's work per hour over a long run is the simulator's capacity goodput
    (other draws, so within the Monte-Carlo noise)."""
    from ntp_planner.failures.simulator import simulate

    cfg = SimConfig(failure_rate_per_gpu_hour=2e-3, days=40, trials=200, bin_s=1800)
    job = _job(plans, "gb200-nvl72", 64)
    results, _ = simulate(job.plan, cfg, ["dp-drop"], np.random.default_rng(3))
    work_s = 30 * 86400
    spec = CapacitySpec(tokens=work_s * job.plan.predicted.tokens_per_s, deadline_days=3650, confidence=0.5,
                        gpus=(64,), trials=200, sim=cfg)  # fmt: skip
    hours = train_hours(spec, sim.EventPool(cfg, spec.trials, 64, seed=1), job, 0, "dp-drop")
    assert 30 * 24 / hours.mean() == pytest.approx(results["dp-drop"].mean.capacity_goodput, rel=0.01)


def test_the_pruned_search_returns_what_simulating_every_candidate_returns(plans):
    """Same grid, same seed: the front and the cheapest are the same, candidate for candidate, and
    every candidate the pruned search skipped is off the brute force's front."""
    spec = SEARCH
    pruned = search(spec, plans, DOMAINS, PRICES)
    brute = search(spec, plans, DOMAINS, PRICES, prune=False)
    assert brute.simulated == 36 and pruned.simulated < 24  # pruning happened
    assert pruned.front and pruned.front == brute.front and pruned.cheapest == brute.cheapest
    on_front = {c.label for c in brute.front}
    skipped = [c for c in pruned.candidates if c.p50_days is None]
    assert skipped and not on_front & {c.label for c in skipped}
    assert {c.reason.split(" ")[0] for c in skipped} == {"too", "dominated"}  # both bounds pruned


def test_failures_forgotten_between_candidates_are_drawn_again_the_same(plans, monkeypatch):
    """With no failures kept from one job to the next (MAX_CACHED_CELLS 0), every candidate comes
    out as when all are kept: the pool redraws the same failures."""
    from ntp_planner.failures import capacity

    spec = SEARCH.model_copy(update={"strategies": ("restart", "ntp")})
    kept = search(spec, plans, DOMAINS, PRICES, prune=False)
    monkeypatch.setattr(capacity, "MAX_CACHED_CELLS", 0)
    assert search(spec, plans, DOMAINS, PRICES, prune=False) == kept


def test_candidates_share_failures_and_the_horizon_changes_no_trial(plans):
    """Common random numbers: a job of 64 GPUs meets exactly the failures of GPUs 0-63 of the
    256-GPU job, and a trial's time to train is the same whichever horizon found it."""
    from ntp_planner.failures.capacity_job import job_tables

    cfg = SimConfig(failure_rate_per_gpu_hour=3e-4)
    pool = sim.EventPool(cfg, 30, 256, seed=5)
    small, big = pool.events(64, 2000.0), pool.events(256, 2000.0)
    keep = big.gpu < 64
    assert np.array_equal(small.start_h, big.start_h[keep]) and np.array_equal(small.trial, big.trial[keep])
    assert small.trial.size > 1000  # about 3e-4 x 64 x (2,000 + 120) h x 30 trials = 1,221
    spec = CapacitySpec(tokens=1e11, deadline_days=30, confidence=0.9, gpus=(64,), trials=30, sim=cfg)
    job = _job(plans)
    tables = job_tables(job, spec, 0)
    work_s = 36 * 3600.0
    short, long = (sim.job_failures(pool, tables, 64, h) for h in (48.0, 400.0))
    # no domain with three failures at once: states.failure_states counts those as two pairs, and
    # its singles go negative (left to the simulator's owner)
    assert (short.states.states >= 0).all() and (long.states.states >= 0).all()
    done = [
        sim.elastic_hours(f, tables.arrays("ntp", "flexible", f.states.states)[0], 0.99, work_s) for f in (short, long)
    ]
    assert np.isfinite(done[0]).sum() >= 10 and np.array_equal(
        done[0][np.isfinite(done[0])], done[1][np.isfinite(done[0])]
    )
    restart = [sim.restart_hours(f.events, 30, f.horizon_h, work_s, 3000.0, 300.0, 660.0) for f in (short, long)]
    ok = np.isfinite(restart[0])
    assert ok.sum() >= 10 and np.array_equal(restart[0][ok], restart[1][ok])


def test_a_search_past_the_workload_bounds_is_refused_with_the_arithmetic():
    from ntp_planner.failures.capacity_spec import check_workload
    from topologies.errors import InputError

    with pytest.raises(InputError, match=r"x 400,000 GPUs x .* failures a trial is over 5,000"):
        check_workload(CapacitySpec(tokens=1e12, deadline_days=300, confidence=0.9, gpus=(400_000,)))
    with pytest.raises(InputError, match=r"trials\(5,000\) x 180,048 time bins .* is over 2e\+07"):
        check_workload(CapacitySpec(tokens=1e12, deadline_days=3000, confidence=0.9, gpus=(8,), trials=5000))
