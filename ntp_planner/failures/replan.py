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
from ntp_planner.failures.experts import ExpertModel, settle
from ntp_planner.failures.packing import Outcome, Packing, degraded_slots, pack, pool_curve
from ntp_planner.plan import Plan
from ntp_planner.replan_result import (
    BatchMode,
    ExpertHosting,
    ReplanResult,
    ReplanThroughput,
    ReplicaState,
    Reshard,
)
from topologies.bounds import show
from topologies.errors import InputError

__all__ = ["Replanner"]


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
        # MoE with ep > 1: the experts' grid after failures (ntp_planner.failures.experts)
        self.experts = ExpertModel(plan, self.usable_bytes) if plan.model.is_moe and lay.ep > 1 else None
        self._sequences: dict[tuple[int, float], int] = {}  # memo of sequences_at (ints, never handed out mutable)
        self._decided: dict[tuple[str, tuple[int, ...]], Outcome] = {}  # memo of decide (frozen outcomes)

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

    def decide(self, policy: str, stage_survivors: list[int]) -> Outcome:
        """What one replica does, given the fewest survivors among its groups at each stage (over
        its cp slices: the slices run at one width, ``ntp_planner.failures.degrade``), and why."""
        key = (policy, tuple(stage_survivors))
        if key not in self._decided:
            self._decided[key] = self._decide(policy, list(stage_survivors))
        return self._decided[key]

    def _decide(self, policy: str, stage_survivors: list[int]) -> Outcome:
        pp, n = self.lay.pp, self.n
        worst = min(stage_survivors)
        if worst == n:
            return Outcome("healthy", (n,) * pp, self.local, (1.0,) * pp)
        why = self._drop_reason(policy, worst)
        if why:
            return Outcome("dropped", (0,) * pp, 0, (0.0,) * pp, why)
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

    def _degraded(self, stage_tp: tuple[int, ...], sequences: int, power: tuple[float, ...]) -> Outcome:
        lay = self.lay
        why = degrade.degraded_reason(stage_tp, sequences, self.local, lay.micro_batch, lay.cp, lay.is_per_layer)
        if any(p != 1.0 for p in power):
            why += f", at up to {max(power):.3g}x power"
        return Outcome("degraded", stage_tp, sequences, power, why)

    def _too_slow(self, degree: int, power: float = 1.0) -> Outcome:
        """A replica dropped because even one micro-batch at ``degree`` overruns the healthy step."""
        one = degraded_step_time(
            self.basis.time_breakdown_s, self.m, 1, self.n, degree, self.work[degree], speed_at_power(power)
        )
        pp = self.lay.pp
        return Outcome("dropped", (0,) * pp, 0, (0.0,) * pp, degrade.time_reason(degree, one, self.healthy_s, power))

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
        packing, fates = self._pack(failed, policy, spares, fallback, batch, domains_down)
        return self._result(policy, batch, failed, packing, fates)

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
        packing, _ = self._pack(failed, policy, spares, fallback, batch, domains_down)
        degree = np.array([o.stage_tp for o in packing.kinds])[packing.kind_of][:, :, None]  # [replica, stage, 1]
        idle = int(np.clip(packing.slot_survivors - degree, 0, None).sum())
        return ReplanThroughput(throughput_relative=packing.throughput, idle_gpus=idle, spares_used=packing.used_spares)

    def _pack(self, failed, policy, spares, fallback, batch, domains_down):
        """The packing, and for an MoE plan with ep > 1 its replicas re-decided by what their EP
        groups lost (``ntp_planner.failures.experts.settle``), with those groups' fates."""
        packing = pack(self, failed, policy, spares, fallback, batch, domains_down)
        if self.experts is None:
            return packing, ()
        return settle(self, packing, packing.fallback or policy, batch == "fixed")

    def fewest_spares(
        self,
        failed: frozenset[int],
        policy: str = "ntp",
        fallback: str = "dp-drop",
        domains_down: frozenset[int] = frozenset(),
    ) -> int:
        """The fewest spare domains with which a fixed batch does not pause: a re-plan with that
        many keeps the batch, one with one fewer pauses (``spare_pool.fewest_domains``)."""
        decider, fails, degraded, _ = degraded_slots(self, failed, policy, 0, fallback, domains_down)
        shape, reached = pool_curve(self, fails, degraded, decider)
        return spare_pool.fewest_domains(shape, reached)

    def _result(
        self, policy: str, batch: BatchMode, failed: frozenset[int], packing: Packing, fates=()
    ) -> ReplanResult:
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
            experts=[self._hosting(f) for f in fates],
        )

    def _hosting(self, fate) -> ExpertHosting:
        em = self.experts
        return ExpertHosting.model_construct(
            stage=fate.stage,
            ep_group=[] if fate.mode == "dropped" else [r for r in fate.ranks if r not in fate.lost],
            lost=list(fate.ranks) if fate.mode == "dropped" else list(fate.lost),
            owners=em.owners(fate),
            mode=fate.mode,
            load_factor=fate.load_factor,
            moved_bytes=fate.moved_bytes,
            reason=fate.reason,
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
