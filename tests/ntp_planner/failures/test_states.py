"""Failure states against hand counts and a brute-force reference: several single-GPU failures
in one NVLink domain at once, the case that pairs of overlaps used to get wrong."""

from collections import Counter

import numpy as np
import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.failures.events import Events
from ntp_planner.failures.sim_config import SimConfig
from ntp_planner.failures.states import Domains, distinct_states, failure_states
from ntp_planner.failures.tables import ThroughputTables
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster


def _events(rows: list[tuple[int, float, float, int, int]]) -> Events:
    """Events from (trial, start_h, end_h, gpu, blast) rows."""
    t, a, b, g, k = (np.array(col) for col in zip(*rows, strict=True))
    return Events(trial=t, start_h=a.astype(float), end_h=b.astype(float), gpu=g, blast=k)


# 8 job GPUs per domain, hosts of 4, 2 idle GPUs per domain; 1-hour bins, 10 of them.
DOM = Domains(used=8, node=4, idle=2)
TRIAL_0 = [
    # domain 0: four singles, all four down in bin 3 (2.6 and 4.4 round to bins 3 and 4)
    (0, 0.0, 6.0, 1, 0),
    (0, 1.0, 5.0, 2, 0),
    (0, 2.0, 8.0, 5, 0),
    (0, 2.6, 4.4, 7, 0),
    # domain 1: two singles, both down in bins 4-6
    (0, 2.0, 7.0, 9, 0),
    (0, 4.0, 9.0, 12, 0),
    # domain 2: one single; a host in domain 3; a whole domain 5 from bin 8 past the end
    (0, 5.0, 12.0, 20, 0),
    (0, -3.0, 3.0, 30, 1),
    (0, 8.0, 12.0, 40, 2),
]
# columns: domains with one failed GPU, hosts, domains, then domains with 2, 3, ... 8 failed GPUs
# bin:      d0 d1 d2 host domain
EXPECTED_0 = [
    [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # 0:  1  .  .  1
    [0, 1, 0, 1, 0, 0, 0, 0, 0, 0],  # 1:  2  .  .  1
    [1, 1, 0, 0, 1, 0, 0, 0, 0, 0],  # 2:  3  1  .  1
    [1, 0, 0, 0, 0, 1, 0, 0, 0, 0],  # 3:  4  1
    [0, 0, 0, 1, 1, 0, 0, 0, 0, 0],  # 4:  3  2
    [1, 0, 0, 2, 0, 0, 0, 0, 0, 0],  # 5:  2  2  1
    [2, 0, 0, 1, 0, 0, 0, 0, 0, 0],  # 6:  1  2  1
    [3, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 7:  1  1  1
    [2, 0, 1, 0, 0, 0, 0, 0, 0, 0],  # 8:  .  1  1     1
    [1, 0, 1, 0, 0, 0, 0, 0, 0, 0],  # 9:  .  .  1     1
]
# single GPUs + 4 a host + 8 a domain
GPUS_DOWN_0 = [1 + 4, 2 + 4, 4 + 4, 5, 5, 5, 4, 3, 2 + 8, 1 + 8]
# a whole domain, a host (4 GPUs > 2 idle), a domain with 3 or more failed GPUs
DOMAINS_DOWN_0 = [1, 1, 2, 1, 1, 0, 0, 0, 1, 1]
# trial 1: six singles at once in domain 4 and two hosts, counts beyond any of trial 0's
TRIAL_1 = [(1, 0.0, 10.0, g, 0) for g in range(32, 38)] + [(1, 0.0, 10.0, 0, 1), (1, 0.0, 10.0, 50, 1)]


def test_several_failures_in_one_domain_match_hand_counts():
    fs = failure_states(_events(TRIAL_0), trials=1, bins=10, bin_h=1.0, domains=DOM)
    assert fs.states[fs.inverse[0]].tolist() == EXPECTED_0
    assert fs.gpus_down[0].tolist() == GPUS_DOWN_0
    assert fs.domains_down[0].tolist() == DOMAINS_DOWN_0
    assert (fs.states >= 0).all()
    assert len(fs.states) == len({tuple(r) for r in EXPECTED_0})  # each distinct state once


def test_a_bins_state_does_not_depend_on_the_other_trials_of_its_batch():
    both = failure_states(_events(TRIAL_0 + TRIAL_1), trials=2, bins=10, bin_h=1.0, domains=DOM)
    assert both.states[both.inverse[0]].tolist() == EXPECTED_0
    assert both.states[both.inverse[1]].tolist() == [[0, 2, 0, 0, 0, 0, 0, 1, 0, 0]] * 10
    assert both.gpus_down[1].tolist() == [6 + 8] * 10 and both.domains_down[1].tolist() == [3] * 10


def test_a_domain_counts_at_most_its_job_gpus():
    """A GPU that fails again while under repair is down twice in ``gpus_down``; its domain
    counts at most ``used`` failed GPUs (here 2 of 2, in a 'pair' column)."""
    fs = failure_states(_events([(0, 0, 2, 1, 0)] * 3), trials=1, bins=2, bin_h=1.0, domains=Domains(2, 2, 0))
    assert fs.states.tolist() == [[0, 0, 0, 1]] and fs.gpus_down.tolist() == [[3, 3]]


def test_distinct_states_do_not_overflow_the_mixed_radix_code():
    """Radices whose product passes 2**63 fall back to sorting rows."""
    parts = [np.array([[0, 40_000, 40_000]])] * 5
    states, inverse = distinct_states(parts)
    assert states.tolist() == [[0] * 5, [40_000] * 5] and inverse.tolist() == [0, 1, 1]


def reference(ev: Events, trials: int, bins: int, bin_h: float, dom: Domains):
    """Every bin of every trial with plain loops: count each domain's failed single GPUs."""
    most = max(2, dom.used)
    rows, gpus, down = [], np.zeros((trials, bins), int), np.zeros((trials, bins), int)
    edges = [
        (min(max(round(a / bin_h), 0), bins), min(max(round(b / bin_h), 0), bins))
        for a, b in zip(ev.start_h, ev.end_h, strict=True)
    ]
    for t in range(trials):
        for j in range(bins):
            per_domain, state = Counter(), [0] * (2 + most)
            for i, (b0, b1) in enumerate(edges):
                if ev.trial[i] != t or not b0 <= j < b1:
                    continue
                kind = int(ev.blast[i])
                gpus[t, j] += (1, dom.node, dom.used)[kind]
                if kind == 0:
                    per_domain[int(ev.gpu[i]) // dom.used] += 1
                else:
                    state[kind] += 1
                    down[t, j] += kind == 2 or dom.idle < dom.node
            for k in per_domain.values():
                k = min(k, most)
                state[0 if k == 1 else k + 1] += 1
                down[t, j] += k > dom.idle
            rows.append(state)
    return np.array(rows).reshape(trials, bins, -1), gpus, down


def _random_events(seed: int, trials: int, bins: int, gpus: int) -> Events:
    """About 12 failures under repair at once among ``gpus`` GPUs: 80% single GPUs."""
    rng = np.random.default_rng(seed)
    n = trials * 60
    start = rng.uniform(-8, bins, n)
    return Events(
        trial=rng.integers(0, trials, n),
        start_h=start,
        end_h=start + rng.uniform(0.2, 20, n),
        gpu=rng.integers(0, gpus, n),
        blast=rng.choice(3, size=n, p=[0.8, 0.15, 0.05]),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dom", [Domains(used=8, node=8, idle=0), Domains(used=6, node=2, idle=2)])
def test_failure_states_match_a_brute_force_count(seed, dom):
    trials, bins = 3, 40
    ev = _random_events(seed, trials, bins, 48)
    fs = failure_states(ev, trials, bins, 1.0, dom)
    states, gpus, down = reference(ev, trials, bins, 1.0, dom)
    assert (states[..., 3:].sum(axis=2) > 0).mean() > 0.5  # most bins hold a domain with 2+ failures
    assert (states[..., 4:].sum(axis=2) > 0).any()  # and some 3 or more
    assert fs.states[fs.inverse].tolist() == states.tolist()
    assert fs.gpus_down.tolist() == gpus.tolist() and fs.domains_down.tolist() == down.tolist()
    assert len(fs.states) == len(np.unique(states.reshape(trials * bins, -1), axis=0))


@pytest.fixture(scope="module")
def h100_tables():
    """llama3-8b at tp8 dp16 on 128 H100s: one TP group per 8-GPU domain, no idle GPUs."""
    layout = ParallelLayout(tp=8, dp=16, global_batch=128, sequence_parallel=True, distributed_optimizer=True)
    plan = plan_from_layout(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=4096, global_batch=128),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=128),
        layout,
    )
    return ThroughputTables(plan, SimConfig())


def test_tables_put_a_domains_failed_gpus_in_one_domain(h100_tables):
    # a pair and a triple: GPUs 0-1 of domain 0, 8-10 of domain 1
    assert h100_tables.failed((0, 0, 0, 1, 1)) == (frozenset({0, 1, 8, 9, 10}), frozenset())
    assert h100_tables.failed((1, 0, 0, 0, 0, 0, 0, 0, 0, 1)) == (frozenset({0, *range(8, 16)}), frozenset())
    # dp-drop: three singles in three domains drop three replicas (7 idle GPUs each),
    # three in one domain drop one (5 idle)
    assert h100_tables.get("dp-drop", "flexible", (3, 0, 0, 0)) == (13 / 16, 21)
    assert h100_tables.get("dp-drop", "flexible", (0, 0, 0, 0, 1)) == (15 / 16, 5)
