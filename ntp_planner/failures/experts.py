"""NTP for mixture-of-experts plans: what a failure does to the experts' grid.

An MoE plan with ep > 1 spreads each stage's routed experts over EP groups
(``RankGrid.expert_groups("ep", ep, etp)``: etp fastest, then ep, then edp over the stage's
tp x cp x dp ranks). Member i of a group holds experts ``i*q .. (i+1)*q - 1`` (``q = experts / ep``,
Megatron's contiguous split), each as its etp shard. A group spans several data-parallel replicas
whenever ep > tp x cp / etp, so a failure reaches past its own replica: once the re-planner has
decided each replica (NTP runs a degraded replica on its first ``stage_tp`` TP ranks, dp-drop drops
it), every rank that has left its EP group (any rank of a dropped replica; on a folded grid,
etp != tp, also a TP rank past a replica's reduced degree, which held experts of its own: unfolded,
NTP re-shards the replica's experts over its surviving TP ranks like its MLP) leaves experts that
must go somewhere:

- **re-hosted**: each lost expert moves to the survivor of the group holding the fewest, lowest rank
  on a tie. The busiest survivor then holds ``q + ceil(q * lost / survivors)`` experts and receives
  that many experts' share of the tokens (dropless routing); the group's all-to-alls wait for it,
  so every replica the group touches runs its expert work ``load_factor = busiest / q`` times
  longer. The share of a healthy step that scales with it (``ExpertModel.share``) is the routed
  experts' part of the compute FLOPs (``cost_models.degraded.replica_flops``) of compute and
  recompute, plus the expert all-to-all; so those replicas run ``1 / (1 + share (load_factor - 1))``
  as fast, cut their sequences to stay within the healthy step (``Replanner.sequences_at``), and run
  in lockstep: the replicas of one group all run the fewest sequences any of them can.
- **dropped** as a unit: every replica the group touches stops, when no member survives, when the
  busiest survivor's extra expert state (weights, gradient, fp32 master and both AdamW moments,
  ``shard_bytes`` per expert) does not fit in its HBM, when even one sequence overruns the healthy
  step, or when dp-drop decides (it degrades no replica).

Re-hosting keeps more throughput whenever it can run (the dropped alternative keeps none of the
group's replicas), so the re-planner takes it exactly when it is feasible. Dropping a replica loses
its ranks from its other groups too, so the two steps repeat until nothing changes. The state that
moves (``moved_bytes``) comes from the experts' data-parallel peers (edp > 1) or the last
checkpoint; its one-off time is the recovery cost, not a step cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from cost_models.degraded import replica_flops, speed_at_power
from cost_models.memory import stage_params
from cost_models.rank_grid import rehost_experts
from ntp_planner.failures.packing import Outcome

if TYPE_CHECKING:
    from ntp_planner.failures.packing import Packing
    from ntp_planner.plan import Plan


@dataclass(frozen=True)
class GroupFate:
    """What one EP group does after a re-plan (``ReplanResult.experts`` is made from it)."""

    stage: int
    ranks: tuple[int, ...]  # the group's ranks in the plan, in order
    lost: tuple[int, ...]  # those that no longer run
    replicas: tuple[int, ...]  # the data-parallel replicas its ranks belong to, ascending
    mode: str  # "rehosted" or "dropped"
    load_factor: float  # the busiest survivor's experts / q (1 when nothing was re-hosted)
    moved_bytes: float  # expert state moved to survivors
    reason: str


class ExpertModel:
    """The parts of an MoE plan's experts that do not depend on which GPUs failed."""

    def __init__(self, plan: Plan, usable_bytes: float):
        lay, model = plan.layout, plan.model
        self.ep, self.experts, self.folded = lay.ep, model.num_experts, lay.folded
        self.q = self.experts // self.ep
        grid = lay.rank_grid
        self.groups = np.asarray(grid.expert_groups("ep", lay.ep, lay.expert_tp), dtype=np.int64)  # [G, ep]
        self.ranks = grid.array("dp", "pp", "cp", "tp")  # [dp, pp, cp, tp] rank ids
        self.replica_of = np.empty(lay.world_size, dtype=np.int64)
        self.replica_of[self.ranks] = np.arange(lay.dp)[:, None, None, None]
        self.stage_of = np.empty(lay.world_size, dtype=np.int64)
        self.stage_of[self.ranks] = np.arange(lay.pp)[None, :, None, None]
        cost = plan.predicted
        flops = replica_flops(model, plan.training, with_vocab=True)
        routed = flops.get("experts", (0.0, 1))[0] / sum(f for f, _ in flops.values())
        parts = cost.time_breakdown_s
        scaled = routed * (parts["compute"] + parts.get("recompute", 0.0)) + parts.get("ep_comm", 0.0)
        self.share = min(1.0, scaled / cost.step_time_s)
        # one expert's shard on one rank: its share of the rank's training state (weights, gradients,
        # optimizer, at the plan's ZeRO level), on the stage with the most MoE layers
        state = sum(v for k, v in cost.memory_breakdown_bytes.items() if k not in ("activations", "runtime_reserved"))
        stage = max(range(lay.pp), key=lambda s: self._moe_layers(plan, s))
        held = sum(
            stage_params(model, range(c.layers[0], c.layers[-1] + 1), lay.tp, lay.ep, c.embedding, c.loss, lay.pp,
                         lay.expert_tp)
            for c in plan.pipeline if c.stage == stage and c.layers
        )  # fmt: skip
        one = self._moe_layers(plan, stage) * model.mlp_params(model.moe_ffn_hidden_size) / lay.expert_tp
        self.shard_bytes = state * one / held if held else 0.0
        self.spare_bytes = usable_bytes - cost.memory_per_gpu_bytes

    @staticmethod
    def _moe_layers(plan: Plan, stage: int) -> int:
        return sum(plan.model.is_moe_layer(i) for c in plan.pipeline if c.stage == stage for i in c.layers)

    def speed(self, load_factor: float) -> float:
        """How fast a replica paced by a group at ``load_factor`` runs, relative to healthy."""
        return 1.0 / (1.0 + self.share * (load_factor - 1.0))

    def fate(self, g: int, lost: np.ndarray, decider: str) -> GroupFate | None:
        """Group ``g`` given which ranks no longer run; None when it lost none."""
        ranks = self.groups[g]
        gone = ranks[lost[ranks]]
        if not gone.size:
            return None
        stage, survivors = int(self.stage_of[ranks[0]]), len(ranks) - len(gone)
        replicas = tuple(sorted(set(self.replica_of[ranks].tolist())))
        base = dict(stage=stage, ranks=tuple(ranks.tolist()), lost=tuple(gone.tolist()), replicas=replicas)
        if decider == "dp-drop":
            return GroupFate(**base, mode="dropped", load_factor=1.0, moved_bytes=0.0, reason="dp-drop drops the group")
        if survivors == 0:
            return GroupFate(**base, mode="dropped", load_factor=1.0, moved_bytes=0.0, reason="no member survives")
        extra = math.ceil(self.q * len(gone) / survivors)
        if extra * self.shard_bytes > self.spare_bytes:
            why = (
                f"the busiest survivor would take {extra} more experts ({extra * self.shard_bytes / 2**30:.1f} GiB of "
                f"state) with {max(0.0, self.spare_bytes) / 2**30:.1f} GiB free"
            )
            return GroupFate(**base, mode="dropped", load_factor=1.0, moved_bytes=0.0, reason=why)
        moved = self.q * len(gone) * self.shard_bytes
        factor = (self.q + extra) / self.q
        why = f"{len(gone)} of {len(ranks)} members lost, experts re-hosted: the busiest survivor holds {factor:.3g}x"
        return GroupFate(**base, mode="rehosted", load_factor=factor, moved_bytes=moved, reason=why)

    def owners(self, fate: GroupFate) -> list[list[int]]:
        """Per expert id, the group's rank holding it after the re-plan (empty when dropped): each
        lost expert to the survivor holding the fewest, lowest rank on a tie."""
        if fate.mode == "dropped":
            return []
        own = rehost_experts([fate.ranks[e // self.q] for e in range(self.experts)], list(fate.ranks), set(fate.lost))
        return [[r] for r in own]


def lost_ranks(em: ExpertModel, outcomes: list[Outcome]) -> np.ndarray:
    """[world] True where a rank has left its EP group: every rank of a dropped replica, and on a
    folded grid (etp != tp) the TP ranks past a degraded replica's degree. Unfolded (etp = tp),
    NTP re-shards a degraded replica's experts over its surviving TP ranks like its MLP columns
    (``cost_models.degraded.work_ratio`` counts them), so its EP groups keep their members."""
    degree = np.array([o.stage_tp for o in outcomes], dtype=np.int64)  # [dp, pp]
    if not em.folded:
        degree = np.where(degree > 0, em.ranks.shape[3], 0)
    tp = em.ranks.shape[3]
    gone = np.arange(tp)[None, None, None, :] >= degree[:, :, None, None]  # [dp, pp, 1, tp]
    lost = np.zeros(em.replica_of.size, dtype=bool)
    lost[em.ranks] = np.broadcast_to(gone, em.ranks.shape)
    return lost


def settle(rp, packing: Packing, decider: str, fixed: bool) -> tuple[Packing, tuple[GroupFate, ...]]:
    """``packing`` with the replicas the experts' grid changes re-decided (module docstring), and
    the fate of every EP group that lost a member. Unchanged when no group lost one."""
    em: ExpertModel = rp.experts
    outcomes = [packing.kinds[k] for k in packing.kind_of.tolist()]
    fates: tuple[GroupFate, ...] = ()
    first: dict[int, GroupFate] = {}
    for _ in range(len(outcomes) + 1):  # each round drops at least one more replica, or settles
        lost = lost_ranks(em, outcomes)
        hit = np.flatnonzero(lost[em.groups].any(axis=1))
        now = {g: f for g in hit.tolist() if (f := em.fate(g, lost, decider)) is not None}
        for g, f in now.items():  # a group dropped in an earlier round keeps the reason it was dropped for
            if f.mode == "dropped" and g in first and first[g].mode == "dropped":
                now[g] = replace(f, reason=first[g].reason)
        first = {**now, **first}
        fates = tuple(now.values())
        new = _apply(rp, em, fates, [packing.kinds[k] for k in packing.kind_of.tolist()])
        if [o.status == "dropped" for o in new] == [o.status == "dropped" for o in outcomes]:
            outcomes = new
            break
        outcomes = new
    if not fates:
        return packing, ()
    kinds = tuple(dict.fromkeys(outcomes))
    index = {o: i for i, o in enumerate(kinds)}
    reached = min(sum(o.sequences for o in outcomes) + packing.extra * rp.local, rp.lay.global_batch)
    paused = fixed and reached < rp.lay.global_batch
    return replace(
        packing,
        kinds=kinds,
        kind_of=np.array([index[o] for o in outcomes], dtype=np.int64),
        reached=reached,
        paused=paused,
        throughput=0.0 if paused else reached / rp.lay.global_batch,
    ), fates


def _apply(rp, em: ExpertModel, fates, outcomes: list) -> list:
    """Each replica's outcome under the groups' fates: dropped with a dropped group, else paced by
    the slowest re-hosted group it is in, and in lockstep with that group's other replicas."""
    pp = rp.lay.pp
    dropped = {r for f in fates if f.mode == "dropped" for r in f.replicas}
    out = list(outcomes)
    for r in dropped:
        if out[r].status != "dropped":
            out[r] = Outcome("dropped", (0,) * pp, 0, (0.0,) * pp, "its EP group is dropped: " + _why(fates, r))
    speed = [1.0] * len(out)
    for f in fates:
        if f.mode == "rehosted":
            for r in f.replicas:
                speed[r] = min(speed[r], em.speed(f.load_factor))
    runs = [_paced(rp, o, v) if o.status != "dropped" and v < 1.0 else o for o, v in zip(out, speed, strict=True)]
    for f in fates:  # lockstep: a group's replicas meet in every all-to-all
        if f.mode != "rehosted":
            continue
        members = f.replicas
        running = [runs[r].sequences for r in members if runs[r].status != "dropped"]
        if not running:
            continue
        fewest = min(running)
        for r in members:
            if runs[r].status != "dropped" and runs[r].sequences > fewest:
                runs[r] = replace(runs[r], sequences=fewest)
    return [
        Outcome("dropped", (0,) * pp, 0, (0.0,) * pp, o.reason) if o.status != "dropped" and o.sequences == 0 else o
        for o in runs
    ]


def _paced(rp, o, speed: float):
    """A running replica slowed to ``speed`` by a re-hosted group: the sequences it fits in the
    healthy step at its degree (degraded replicas keep their own reason first)."""
    degree = min(o.stage_tp)
    b = min(o.sequences, rp.sequences_at(degree, speed * _power_speed(o)))
    why = f"paced by re-hosted experts of its EP group ({speed:.3g}x speed): {b} of {rp.local} sequences"
    if b == 0:
        return Outcome("dropped", (0,) * rp.lay.pp, 0, (0.0,) * rp.lay.pp, why)
    reason = f"{o.reason}; {why}" if o.status == "degraded" and o.reason else why
    return Outcome("degraded", o.stage_tp, b, o.power, reason)


def _power_speed(o) -> float:
    return speed_at_power(min(o.power)) if o.power and min(o.power) > 0 else 1.0


def _why(fates, replica: int) -> str:
    hit = (f for f in fates if f.mode == "dropped" and replica in f.replicas)
    return next(hit).reason
