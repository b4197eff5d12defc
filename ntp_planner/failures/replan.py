"""Re-planning after GPU failures: what each data-parallel replica does.

A replica is pp x cp TP groups of ``tp`` GPUs (one group = one NVLink domain when tp equals the
domain size). After failures the job restarts and ranks are reassigned: degraded groups are
packed into as few replicas as possible, worst groups together (the NTP paper's packing; the
drop baseline packs too). The healthy groups refill the replicas in the plan's own order (replica,
then stage, then cp rank), so without failures every rank keeps its GPU. Policies
(shared/reference/ntp.md):

- ``dp-drop``: every replica holding a degraded group is dropped.
- ``ntp``: a degraded replica runs all stages at TP = the survivors of its worst group (units
  spread unevenly, the fullest GPU paces), with the most sequences whose step time stays within
  the healthy one (counted in sequences: the micro-batches are re-cut, the last one smaller, so
  a replica that only just misses the healthy step loses one sequence, not a whole micro-batch);
  replicas below the smallest degree that fits memory are dropped; gradients are averaged
  weighted by samples.
- ``ntp-pw``: only the stages that lost GPUs run reduced, the local batch is kept, and their
  survivors are power-boosted just enough to keep pace (speed-vs-power curve); beyond the
  maximum boost the replica falls back to fewer micro-batches at maximum power.
- ``spares``: the fallback policy with the spare domains (kept for the CLI; every policy now
  draws on ``spares``).

Spare domains (``spares``) are a pool every policy draws on (``ntp_planner.failures.spare_pool``):
they replace degraded TP groups, worst first, or join as whole extra replicas that make up the
samples degraded or dropped replicas no longer process, whichever keeps more of the batch with
the fewest domains. ``ReplanResult.extra_replicas`` and ``spares_note`` say how they were used.

A degraded stage runs every block at its reduced width, whatever degrees a per-layer plan gave
them, and a replica's cp slices run at the width of its worst slice (``ntp_planner.failures.degrade``
says why, and costs a per-layer replica accordingly). Every replica that is not healthy carries the
reason it is degraded or dropped (``ReplicaState.reason``).

Before any policy, in-domain spares: a job that uses part of each NVLink domain
(``Cluster.gpus_per_domain``, or a partial last domain) leaves idle GPUs there. A domain whose
failed GPUs number at most its idle GPUs stays healthy: the job remaps the TP ranks of the failed
GPUs onto idle GPUs of the same domain (``ntp_planner.failures.sampling.in_domain_cover``), lowest failed
ids first. Only the failures beyond the idle count degrade groups. A domain lost whole
(``domains_down``, a domain-wide blast) has no idle GPUs left to give.

Global batch ``flexible`` shrinks with lost samples; ``fixed`` pauses the job (throughput 0)
when the replicas cannot reach the target batch within a healthy step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cost_models.degraded import (
    MAX_POWER,
    degraded_step_time,
    power_for_speed,
    reshard_cost,
    speed_at_power,
    work_ratio,
)
from ntp_planner.failures import degrade, spare_pool
from ntp_planner.failures.sampling import in_domain_cover
from ntp_planner.plan import Plan
from ntp_planner.replan_result import (  # re-exported: the artifact's types, where callers used to find them
    BATCH_MODES,
    FIX,
    POLICIES,
    BatchMode,
    Count,
    Fallback,
    Policy,
    ReplanResult,
    ReplanThroughput,
    ReplicaState,
    Reshard,
)
from topologies.bounds import show
from topologies.errors import InputError


@dataclass(frozen=True)
class _Outcome:
    status: str
    stage_tp: tuple[int, ...]
    sequences: int  # local batch
    power: tuple[float, ...]
    reason: str | None = None  # ReplicaState.reason


@dataclass(frozen=True)
class _Packing:
    """Which TP slot each replica slot takes after failures, and what each replica then does."""

    fallback: str | None  # the policy that decided the degraded replicas, under ``spares``
    stand_in: tuple[tuple[int, int], ...]  # (failed GPU, the idle GPU of its domain taking its ranks)
    n_degraded: int  # TP slots still degraded after in-domain spares, before spare domains
    used_spares: int  # spare domains used
    extra: int  # whole replicas formed from spare domains
    note: str | None  # how the pool was used
    order: np.ndarray  # [dp * pp * cp] physical TP slot of each replica slot (replica-major); -1 = spare
    slot_survivors: np.ndarray  # [dp, pp, cp] healthy GPUs of each replica slot
    kinds: tuple[_Outcome, ...]  # what replicas do, one entry per distinct decision
    kind_of: np.ndarray  # [dp] index into ``kinds`` of each replica
    reached: int  # sequences per step
    paused: bool
    throughput: float


__all__ = [
    "BATCH_MODES",
    "FIX",
    "POLICIES",
    "BatchMode",
    "Count",
    "Fallback",
    "Policy",
    "ReplanResult",
    "ReplanThroughput",
    "Replanner",
    "ReplicaState",
    "Reshard",
]


class Replanner:
    """Everything about a plan that does not depend on which GPUs failed, computed once."""

    def __init__(self, plan: Plan, max_power: float = 1.3):
        if not 1 <= max_power <= MAX_POWER:  # also refuses nan
            raise InputError(
                f"max_power {show(max_power)} must lie in [1, {MAX_POWER}] (1 = no boost; no GPU board allows "
                f"more than {MAX_POWER}x its default power)"
            )
        lay = plan.layout
        self.plan, self.lay, self.max_power = plan, lay, max_power
        self.cluster = plan.cluster.build()
        self.n = lay.tp
        self.slots_per_replica = lay.pp * lay.cp
        # GPUs of every TP slot of the plan, replica-major as replicas are refilled: [dp, pp, cp, tp],
        # slot index (r * pp + s) * cp + c. With no failure, packing then gives every slot back its GPUs.
        self.slot_gpus = np.asarray(plan.placement, dtype=np.int64)[lay.rank_grid.array("dp", "pp", "cp", "tp")]
        self.m = lay.num_micro_batches
        self.healthy_s = plan.predicted.step_time_s
        # a degraded replica scales from every block at the stage width (per-layer plans: ntp_planner.failures.degrade)
        self.basis = degrade.degraded_basis(plan)
        self.usable_bytes = self.basis.hbm_bytes * (1 - plan.headroom)
        self.work = {k: work_ratio(plan.model, plan.training, self.n, k) for k in range(1, self.n + 1)}
        fits = [k for k in range(1, self.n + 1) if self.memory_at(k) <= self.usable_bytes]
        self.min_degree = min(fits) if fits else self.n
        self.local = self.m * lay.micro_batch
        self._sequences: dict[tuple[int, float], int] = {}  # memo of sequences_at (ints, never handed out mutable)
        self._decided: dict[tuple[str, tuple[int, ...]], _Outcome] = {}  # memo of decide (frozen outcomes)

    # ---- per-replica decisions -------------------------------------------------------------
    def memory_at(self, degree: int) -> float:
        """Bytes on the fullest GPU of a replica at ``degree``: all but the runtime's reserve grow
        with the fullest GPU's share of the units."""
        parts = self.basis.memory_breakdown_bytes
        scaled = sum(v for k, v in parts.items() if k != "runtime_reserved")
        return scaled * self.work[degree] + parts["runtime_reserved"]

    def sequences_at(self, degree: int, speed: float = 1.0) -> int:
        """Most sequences a replica at ``degree`` runs within the healthy step time. Counted in
        sequences: b sequences are re-cut into micro-batches of at most the plan's size, the last
        one smaller, and cost b / micro_batch micro-batches' time (compute and TP traffic scale with
        the tokens; the bubble is that of a full micro-batch, an upper bound)."""
        key = (degree, speed)
        if key not in self._sequences:
            br, m, mb = self.basis.time_breakdown_s, self.m, self.lay.micro_batch
            best = 0
            for b in range(m * mb, 0, -1):
                if degraded_step_time(br, m, b / mb, self.n, degree, self.work[degree], speed) <= self.healthy_s * (
                    1 + 1e-12
                ):
                    best = b
                    break
            self._sequences[key] = best
        return self._sequences[key]

    def decide(self, policy: str, stage_survivors: list[int]) -> _Outcome:
        """What one replica does, given the fewest survivors among its groups at each stage (over
        its cp slices: the slices run at one width, ``ntp_planner.failures.degrade``), and why."""
        key = (policy, tuple(stage_survivors))
        if key not in self._decided:
            self._decided[key] = self._decide(policy, list(stage_survivors))
        return self._decided[key]

    def _decide(self, policy: str, stage_survivors: list[int]) -> _Outcome:
        pp, n = self.lay.pp, self.n
        worst = min(stage_survivors)
        if worst == n:
            return _Outcome("healthy", (n,) * pp, self.local, (1.0,) * pp)
        why = self._drop_reason(policy, worst)
        if why:
            return _Outcome("dropped", (0,) * pp, 0, (0.0,) * pp, why)
        if policy == "ntp":
            b = self.sequences_at(worst)
            return self._degraded((worst,) * pp, b, (1.0,) * pp) if b else self._too_slow(worst)
        # ntp-pw: reduced stages keep pace by power, up to the maximum
        powers = tuple(power_for_speed(self.work[s], self.max_power) if s < n else 1.0 for s in stage_survivors)
        if all(math.isfinite(p) for p in powers):
            return self._degraded(tuple(stage_survivors), self.local, powers)
        b = self.sequences_at(worst, speed_at_power(self.max_power))
        if not b:
            return self._too_slow(worst, self.max_power)
        capped = tuple(self.max_power if s < n else 1.0 for s in stage_survivors)
        return self._degraded(tuple(stage_survivors), b, capped)

    def _drop_reason(self, policy: str, worst: int) -> str | None:
        """Why a replica whose worst TP group kept ``worst`` GPUs must drop before any timing."""
        if policy == "dp-drop":
            return degrade.policy_reason(policy)
        if worst == 0:
            return degrade.lost_group_reason(self.n)
        if worst < self.min_degree:
            return degrade.memory_reason(worst, self.memory_at(worst), self.usable_bytes, self.min_degree, self.n)
        return None

    def _degraded(self, stage_tp: tuple[int, ...], sequences: int, power: tuple[float, ...]) -> _Outcome:
        lay = self.lay
        why = degrade.degraded_reason(stage_tp, sequences, self.local, lay.micro_batch, lay.cp, lay.is_per_layer)
        if any(p != 1.0 for p in power):
            why += f", at up to {max(power):.3g}x power"
        return _Outcome("degraded", stage_tp, sequences, power, why)

    def _too_slow(self, degree: int, power: float = 1.0) -> _Outcome:
        """A replica dropped because even one micro-batch at ``degree`` overruns the healthy step."""
        one = degraded_step_time(
            self.basis.time_breakdown_s, self.m, 1, self.n, degree, self.work[degree], speed_at_power(power)
        )
        pp = self.lay.pp
        return _Outcome("dropped", (0,) * pp, 0, (0.0,) * pp, degrade.time_reason(degree, one, self.healthy_s, power))

    # ---- the whole job -----------------------------------------------------------------------
    def replan(
        self,
        failed: frozenset[int],
        policy: str = "ntp",
        spares: int = 0,
        fallback: str = "dp-drop",
        batch: BatchMode = "flexible",
        domains_down: frozenset[int] = frozenset(),
    ) -> ReplanResult:
        """Re-plan for ``failed`` GPUs: what every replica does and the GPU of every rank.
        ``domains_down``: domains lost whole, whose idle GPUs cannot stand in."""
        packing = self._pack(failed, policy, spares, fallback, batch, domains_down)
        return self._result(policy, batch, failed, packing)

    def throughput(
        self,
        failed: frozenset[int],
        policy: str = "ntp",
        spares: int = 0,
        fallback: str = "dp-drop",
        batch: BatchMode = "flexible",
        domains_down: frozenset[int] = frozenset(),
    ) -> ReplanThroughput:
        """The throughput and idle GPUs of ``replan`` without building the rank map (for sweeps
        and the simulator, which re-plan thousands of times)."""
        packing = self._pack(failed, policy, spares, fallback, batch, domains_down)
        degree = np.array([o.stage_tp for o in packing.kinds])[packing.kind_of][:, :, None]  # [replica, stage, 1]
        idle = int(np.clip(packing.slot_survivors - degree, 0, None).sum())
        return ReplanThroughput(throughput_relative=packing.throughput, idle_gpus=idle, spares_used=packing.used_spares)

    def _pack(
        self,
        failed: frozenset[int],
        policy: str,
        spares: int,
        fallback: str,
        batch: BatchMode,
        domains_down: frozenset[int],
    ) -> _Packing:
        """Use the spare pool, pack the degraded TP slots into as few replicas as possible and
        decide each replica."""
        decider, fails, degraded, stand_in = self._degraded_slots(failed, policy, spares, fallback, domains_down)
        shape, reached = self._pool_curve(fails, degraded, decider, most=spares * max(1, self._per_domain))
        replace, extra, used = spare_pool.best_use(shape, reached, spares)
        lay, n = self.lay, self.n
        survivors = n - fails
        healthy_groups = np.flatnonzero(fails == 0)
        order = np.concatenate([healthy_groups, np.full(replace, -1, dtype=np.int64), degraded[replace:]])
        slot_survivors = np.where(order >= 0, survivors[np.maximum(order, 0)], n).reshape(lay.dp, lay.pp, lay.cp)
        # replicas with the same fewest survivors per stage do the same: decide once per kind
        kinds, kind_of = np.unique(slot_survivors.min(axis=2), axis=0, return_inverse=True)
        decided = [self.decide(decider, kind.tolist()) for kind in kinds]
        kind_of = kind_of.reshape(-1)
        reached_now = min(int(reached[replace]) + extra * self.local, lay.global_batch)
        paused = batch == "fixed" and reached_now < lay.global_batch
        return _Packing(
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

    def _degraded_slots(
        self, failed: frozenset[int], policy: str, spares: int, fallback: str, domains_down: frozenset[int]
    ) -> tuple[str, np.ndarray, np.ndarray, tuple[tuple[int, int], ...]]:
        """(the policy that decides replicas, failed GPUs per physical TP slot, the degraded slots
        worst first, the in-domain stand-ins), after checking the arguments."""
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        if fallback not in ("dp-drop", "ntp", "ntp-pw"):
            raise ValueError(f"unknown fallback {fallback!r}; choose dp-drop, ntp or ntp-pw")
        if spares < 0:
            raise InputError(f"spares {spares} must be zero or more")
        lay, R = self.lay, self.slots_per_replica
        ids, covered, spare_ids = in_domain_cover(
            self.cluster, np.fromiter(failed, np.int64, len(failed)), domains_down
        )
        # failed GPUs in each physical TP slot (index (r * pp + s) * cp + c)
        fails = np.isin(self.slot_gpus, ids).sum(axis=3).ravel() if ids.size else np.zeros(lay.dp * R, np.int64)
        degraded = np.flatnonzero(fails)
        degraded = degraded[np.argsort(-fails[degraded], kind="stable")]  # worst first
        stand_in = tuple(zip(covered.tolist(), spare_ids.tolist(), strict=True))
        return (fallback if policy == "spares" else policy), fails, degraded, stand_in

    @property
    def _per_domain(self) -> int:
        """TP slots one spare domain holds."""
        return max(1, self.cluster.used_per_domain // self.n)

    def _pool_curve(self, fails: np.ndarray, degraded: np.ndarray, decider: str, most: int | None = None):
        """The pool's shape and the sequences per step for every number of slots replaced (up to
        ``most``)."""
        lay = self.lay
        shape = spare_pool.PoolShape(
            replicas=lay.dp,
            stages=lay.pp,
            cp=lay.cp,
            tp=self.n,
            local=self.local,
            target=lay.global_batch,
            per_domain=self._per_domain,  # a spare domain is used like the others
        )
        run = lambda stage_min: self.decide(decider, list(stage_min)).sequences  # noqa: E731
        return shape, spare_pool.reached_by_replacements(shape, self.n - fails[degraded], run, most)

    def fewest_spares(
        self,
        failed: frozenset[int],
        policy: str = "ntp",
        fallback: str = "dp-drop",
        domains_down: frozenset[int] = frozenset(),
    ) -> int:
        """The fewest spare domains with which a fixed batch does not pause: a re-plan with that
        many keeps the batch, one with one fewer pauses (``spare_pool.fewest_domains``)."""
        decider, fails, degraded, _ = self._degraded_slots(failed, policy, 0, fallback, domains_down)
        shape, reached = self._pool_curve(fails, degraded, decider)
        return spare_pool.fewest_domains(shape, reached)

    def _result(self, policy: str, batch: BatchMode, failed: frozenset[int], packing: _Packing) -> ReplanResult:
        """The detailed result: every replica's state and the GPU of every rank."""
        lay, n, R = self.lay, self.n, self.slots_per_replica
        groups = self.slot_gpus.reshape(lay.dp * R, n)  # GPUs of each physical TP slot
        # ranks of each replica slot in TP order, [replica][stage * cp + c][i]
        slot_ranks = lay.rank_grid.array("dp", "pp", "cp", "tp").reshape(lay.dp, R, n).tolist()
        stand_in = dict(packing.stand_in)
        rank_to_gpu: list[int | None] = [None] * lay.world_size
        replicas, used = [], set()
        outcomes = [packing.kinds[k] for k in packing.kind_of.tolist()]
        for r, out in enumerate(outcomes):
            gpus_used = idle = 0
            for j in range(R):
                s = j // lay.cp
                g = int(packing.order[r * R + j])
                gpus = [] if g < 0 else [stand_in.get(int(x), int(x)) for x in groups[g]]
                alive = [x for x in gpus if x not in failed]
                degree = out.stage_tp[s] if g >= 0 else 0
                for rank, gpu in zip(slot_ranks[r][j], alive[:degree], strict=False):  # TP ranks past it: None
                    rank_to_gpu[rank] = gpu
                    used.add(gpu)
                gpus_used += min(degree, len(alive))
                idle += len(alive) - min(degree, len(alive))
            replicas.append(
                ReplicaState.model_construct(
                    replica=r,
                    status=out.status,
                    stage_tp=list(out.stage_tp),
                    local_batch=out.sequences,
                    power=list(out.power),
                    gpus_used=gpus_used,
                    gpus_idle=idle,
                    reason=out.reason,
                )
            )
        healthy = set(range(self.plan.cluster.num_gpus)) - set(failed)
        return ReplanResult.model_construct(
            plan_hash=self.plan.inputs_hash,
            policy=policy,
            fallback=packing.fallback,
            batch=batch,
            failed_gpus=len(failed),
            in_domain_spares_used=len(stand_in),
            degraded_groups=packing.n_degraded,
            spares_used=packing.used_spares,
            throughput_relative=packing.throughput,
            global_batch_target=lay.global_batch,
            global_batch_reached=packing.reached,
            paused=packing.paused,
            healthy_step_time_s=self.healthy_s,
            replicas=replicas,
            reshard=self._reshard(outcomes),
            rank_to_gpu=rank_to_gpu,
            idle_gpus=sorted(healthy - used),
            extra_replicas=packing.extra,
            spares_note=packing.note,
        )

    def _reshard(self, outs) -> Reshard | None:
        """NTP's gradient reshard between the healthy replicas and the narrowest degraded one
        (``cost_models.degraded.reshard_cost``)."""
        n = self.n
        reduced = [min(t for t in o.stage_tp if t) for o in outs if o.status == "degraded"]
        if not reduced or all(o.status != "healthy" for o in outs) or min(reduced) == n:
            return None
        cost = self.plan.predicted
        busiest, before, overlap = reshard_cost(
            cost.memory_breakdown_bytes["weights"],
            2.0 if self.plan.training.dtype == "fp16" else 4.0,
            n,
            min(reduced),
            self.plan.cluster.spec.nvlink_bw_bytes_per_s,
            cost.time_breakdown_s["compute"] / self.m,
        )
        return Reshard(
            bytes_before_per_gpu=busiest,
            bytes_after_per_gpu=busiest,
            time_s=2 * before,
            overlap_s=overlap,
            exposed_s=2 * before - overlap,
        )
