"""Throughput of each failure state per strategy (``ThroughputTables``): the simulator's third step,
re-planned with ``Replanner`` once per distinct state and cached."""

from __future__ import annotations

import numpy as np

from ntp_planner.failures.replan import Replanner
from ntp_planner.failures.sim_config import SimConfig
from ntp_planner.plan import Plan


class ThroughputTables:
    """Throughput and idle GPUs of each failure state (failed units in distinct domains), per
    strategy and batch mode, re-planned once and cached."""

    def __init__(self, plan: Plan, cfg: SimConfig):
        self.replanner = Replanner(plan)
        self.cfg, self.cluster = cfg, self.replanner.cluster
        self.node = min(self.cluster.spec.gpus_per_node, self.cluster.used_per_domain)
        self.cache: dict[tuple[str, str, int], tuple[float, int]] = {}
        self.needs: dict[tuple, int] = {}
        self.states: dict[tuple[int, ...], tuple[frozenset[int], frozenset[int]]] = {}

    def failed(self, state: tuple[int, ...]) -> tuple[frozenset[int], frozenset[int]]:
        """(failed GPUs, domains lost whole) of a state = failed units (one GPU, a host, a domain,
        then k = 2, 3, ... GPUs of a domain: ``failure_states``' columns), each unit in its own
        NVLink domain, its GPUs the domain's first; a failed domain is every GPU the job uses
        there, and its idle GPUs."""
        if state in self.states:
            return self.states[state]
        c = self.cluster
        failed, down, d = set(), set(), 0
        for kind, count in enumerate(state):
            for _ in range(count):
                if d < c.num_domains:
                    width = min(self.width(kind), c.used_in_domain(d))
                    failed.update(range(d * c.used_per_domain, d * c.used_per_domain + width))
                    if kind == 2:
                        down.add(d)
                d += 1
        self.states[state] = (frozenset(failed), frozenset(down))
        return self.states[state]

    def width(self, kind: int) -> int:
        """GPUs one unit of column ``kind`` of a state fails: 1, a host, a domain, then k = kind - 1."""
        return (1, self.node, self.cluster.used_per_domain)[kind] if kind < 3 else kind - 1

    def get(self, strategy: str, batch: str, state: tuple[int, ...]) -> tuple[float, int]:
        """Throughput and idle GPUs of ``state`` (see ``failed``) with the pool of ``cfg.spares``."""
        key = (strategy, batch, state)
        if key not in self.cache:
            failed, down = self.failed(state)
            kept = self.replanner.throughput(failed, strategy, self.cfg.spares, "dp-drop", batch, domains_down=down)
            self.cache[key] = (kept.throughput_relative, kept.idle_gpus)
        return self.cache[key]

    def need(self, policy: str, state: tuple[int, ...]) -> int:
        """Fewest spare domains with which ``state`` keeps a fixed batch (``Replanner.fewest_spares``)."""
        key = ("need", policy, state)
        if key not in self.needs:
            failed, down = self.failed(state)
            self.needs[key] = self.replanner.fewest_spares(failed, policy, "dp-drop", domains_down=down)
        return self.needs[key]

    def arrays(self, strategy: str, batch: str, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Throughput and idle GPUs for each row of ``states`` (unit counts, ``FailureStates.states``)."""
        pairs = [self.get(strategy, batch, tuple(int(x) for x in row)) for row in states]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=float)
