"""How a re-plan packs the TP slots after failures (``ntp_planner.failures.replan`` describes the
policies): count each slot's failed GPUs after in-domain spares, use the spare-domain pool
(``spare_pool``), pack the degraded slots into as few replicas as possible, worst first, and
decide each kind of replica once (``Replanner.decide``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ntp_planner.failures import spare_pool
from ntp_planner.failures.sampling import in_domain_cover
from ntp_planner.replan_result import POLICIES, BatchMode
from topologies.errors import InputError

if TYPE_CHECKING:
    from cost_models.layout import ParallelLayout
    from topologies.cluster import Cluster


@dataclass(frozen=True)
class Outcome:
    """What one kind of replica does (``Replanner.decide``): the fields of its ``ReplicaState``
    that do not depend on which GPUs it holds."""

    status: str
    stage_tp: tuple[int, ...]
    sequences: int  # local batch
    power: tuple[float, ...]
    reason: str | None = None  # ReplicaState.reason


class Replanner(Protocol):
    """What packing asks of the re-planner (``failures.replan.Replanner``, which passes itself):
    a protocol, so that packing does not import the module that imports it."""

    cluster: Cluster
    lay: ParallelLayout
    n: int  # the plan's TP degree
    local: int  # sequences per replica per step
    slots_per_replica: int  # pp * cp TP slots
    slot_gpus: np.ndarray  # [dp, pp, cp, tp] physical GPU of each rank

    def decide(self, policy: str, stage_survivors: list[int]) -> Outcome: ...


@dataclass(frozen=True)
class Packing:
    """Which TP slot each replica slot takes after failures, and what each replica then does."""

    fallback: str | None  # the policy that decided the degraded replicas, under ``spares``
    stand_in: tuple[tuple[int, int], ...]  # (failed GPU, the idle GPU of its domain taking its ranks)
    n_degraded: int  # TP slots still degraded after in-domain spares, before spare domains
    used_spares: int  # spare domains used
    extra: int  # whole replicas formed from spare domains
    note: str | None  # how the pool was used
    order: np.ndarray  # [dp * pp * cp] physical TP slot of each replica slot (replica-major); -1 = spare
    slot_survivors: np.ndarray  # [dp, pp, cp] healthy GPUs of each replica slot
    kinds: tuple[Outcome, ...]  # what replicas do, one entry per distinct decision
    kind_of: np.ndarray  # [dp] index into ``kinds`` of each replica
    reached: int  # sequences per step
    paused: bool
    throughput: float


def pack(
    rp: Replanner,
    failed: frozenset[int],
    policy: str,
    spares: int,
    fallback: str,
    batch: BatchMode,
    domains_down: frozenset[int],
) -> Packing:
    """Use the spare pool, pack the degraded TP slots into as few replicas as possible and
    decide each replica."""
    decider, fails, degraded, stand_in = degraded_slots(rp, failed, policy, spares, fallback, domains_down)
    shape, reached = pool_curve(rp, fails, degraded, decider, most=spares * max(1, slots_per_domain(rp)))
    replace, extra, used = spare_pool.best_use(shape, reached, spares)
    lay, n = rp.lay, rp.n
    survivors = n - fails
    healthy_groups = np.flatnonzero(fails == 0)
    order = np.concatenate([healthy_groups, np.full(replace, -1, dtype=np.int64), degraded[replace:]])
    slot_survivors = np.where(order >= 0, survivors[np.maximum(order, 0)], n).reshape(lay.dp, lay.pp, lay.cp)
    # replicas with the same fewest survivors per stage do the same: decide once per kind
    kinds, kind_of = np.unique(slot_survivors.min(axis=2), axis=0, return_inverse=True)
    decided = [rp.decide(decider, kind.tolist()) for kind in kinds]
    kind_of = kind_of.reshape(-1)
    reached_now = min(int(reached[replace]) + extra * rp.local, lay.global_batch)
    paused = batch == "fixed" and reached_now < lay.global_batch
    return Packing(
        fallback=decider if policy == "spares" else None,
        stand_in=stand_in,
        n_degraded=int(degraded.size),
        used_spares=used,
        extra=extra,
        note=spare_pool.describe(replace, extra, used, spares),
        order=order,
        slot_survivors=slot_survivors,
        kinds=tuple(decided),
        kind_of=kind_of,
        reached=reached_now,
        paused=paused,
        throughput=0.0 if paused else reached_now / lay.global_batch,
    )


def degraded_slots(
    rp: Replanner, failed: frozenset[int], policy: str, spares: int, fallback: str, domains_down: frozenset[int]
) -> tuple[str, np.ndarray, np.ndarray, tuple[tuple[int, int], ...]]:
    """(the policy that decides replicas, failed GPUs per physical TP slot, the degraded slots
    worst first, the in-domain stand-ins), after checking the arguments."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if fallback not in ("dp-drop", "ntp", "ntp-pw"):
        raise ValueError(f"unknown fallback {fallback!r}; choose dp-drop, ntp or ntp-pw")
    if spares < 0:
        raise InputError(f"spares {spares} must be zero or more")
    lay, R = rp.lay, rp.slots_per_replica
    ids, covered, spare_ids = in_domain_cover(rp.cluster, np.fromiter(failed, np.int64, len(failed)), domains_down)
    # failed GPUs in each physical TP slot (index (r * pp + s) * cp + c)
    fails = np.isin(rp.slot_gpus, ids).sum(axis=3).ravel() if ids.size else np.zeros(lay.dp * R, np.int64)
    degraded = np.flatnonzero(fails)
    degraded = degraded[np.argsort(-fails[degraded], kind="stable")]  # worst first
    stand_in = tuple(zip(covered.tolist(), spare_ids.tolist(), strict=True))
    return (fallback if policy == "spares" else policy), fails, degraded, stand_in


def slots_per_domain(rp: Replanner) -> int:
    """TP slots one spare domain holds."""
    return max(1, rp.cluster.used_per_domain // rp.n)


def pool_curve(rp: Replanner, fails: np.ndarray, degraded: np.ndarray, decider: str, most: int | None = None):
    """The pool's shape and the sequences per step for every number of slots replaced (up to
    ``most``)."""
    lay = rp.lay
    shape = spare_pool.PoolShape(
        replicas=lay.dp,
        stages=lay.pp,
        cp=lay.cp,
        tp=rp.n,
        local=rp.local,
        target=lay.global_batch,
        per_domain=slots_per_domain(rp),  # a spare domain is used like the others
    )
    run = lambda stage_min: rp.decide(decider, list(stage_min)).sequences  # noqa: E731
    return shape, spare_pool.reached_by_replacements(shape, rp.n - fails[degraded], run, most)
