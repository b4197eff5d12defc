"""The next layout of a running job after some of its processes died (or came back): which
process runs which rank of which stage, at what width, with how many micro-batches. Pure and
deterministic, no torch: the membership side calls it once per failure or repair and the state
mover reads the answer.

Terms. The *base* layout is the healthy run ``shrunk.spec``. Process ids are fixed for life:
process ``p < base.world_size`` starts at base rank ``p``; ``spares`` more ids follow and start
idle. ``slots[b]`` is the process filling base rank ``b``, or None when its process died and
nobody stands in. Worked example, TP4 x DP2 shrunk to 8 processes, process 1 killed, ``ntp``:

    slots  0 . 2 3 | 4 5 6 7      (base ranks 0-3: replica 0, 4-7: replica 1)
    ranks  0 1 2   | 3 4 5 6      (renumbered in base-rank order: procs = (0, 2, 3, 4, 5, 6, 7))

replica 0 runs one TP3 stage, every block at degree 3, with fewer micro-batches; replica 1 keeps
its blocks. Under ``dp-drop`` replica 0 is dropped and processes 0, 2, 3 are idle.

Each run replica is decided alone, by the plan's ``Replanner.decide`` on the survivors of the plan
stages it stands for (the fewest over its cp slices), not by ``Replanner.replan``: a re-plan packs
degraded TP groups into as few replicas as possible, moving groups between replicas and stages,
which a live run does not do (its processes hold their replica's state). Before deciding, a
failed GPU that the plan covers with an idle GPU of its NVLink domain (``in_domain_cover``, as
``replan`` does) counts as a survivor: the plan says its replica stays healthy. The run then
needs a process for that slot: an idle spare process if there is one (the replica is
"replaced"), else the replica runs degraded at the width its live processes fill, at the full
batch, and its reason says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ntp_planner.executor.parallel.hosting import as_hosting, lockstep, rehost
from ntp_planner.executor.shrink.run import Shrunk, scaled_micro_batches
from ntp_planner.executor.spec import Block, ReplicaSpec, RunSpec, StageSpec
from ntp_planner.failures.replan import Replanner
from ntp_planner.failures.sampling import in_domain_cover
from ntp_planner.plan import Plan

POLICIES = ("dp-drop", "ntp", "ntp-pw", "spares", "restart")
# the Replanner's policy that decides a replica with an empty slot: ``spares`` fills slots with
# spare processes first and drops what is left (its fallback); ``restart`` reloads a checkpoint
# on the dp-drop layout (the reload is the caller's business)
DECIDER = {"dp-drop": "dp-drop", "ntp": "ntp", "ntp-pw": "ntp-pw", "spares": "dp-drop", "restart": "dp-drop"}


@dataclass(frozen=True)
class ReplicaChange:
    """What one data replica of the base run does now (its cp slices share it)."""

    status: str  # "healthy" | "degraded" | "dropped" | "replaced" (spare processes stand in at full width)
    widths: tuple[int, ...]  # run stage widths now (0s when dropped)
    micro_batches: int  # per step; 0 when dropped
    reason: str | None  # the Replanner's reason, or why it is what it is; None when healthy


@dataclass(frozen=True)
class Layout:
    """One generation of the job: the run and which process runs each of its ranks."""

    spec: RunSpec | None  # the run, ranks 0..world-1; None when no replica can run
    procs: tuple[int, ...]  # procs[rank] = process id running rank ``rank`` of spec
    idle: tuple[int, ...]  # live processes outside the run (a dropped replica's, unused spares), sorted
    slots: tuple[int | None, ...]  # base rank -> live process filling it, spares placed; None = empty
    replicas: tuple[ReplicaChange, ...]  # one per data replica of the base run
    policy: str  # the policy that made it ("none" for the base)

    @property
    def batch(self) -> int:
        """Sequences per step."""
        return 0 if self.spec is None else self.spec.total_sequences

    def describe(self) -> str:
        """One line for a timeline, e.g. ``TP4 + TP3 (ntp), PP1, 2+1 micro-batches of 2``."""
        if self.spec is None:
            return f"nothing runs ({self.policy}): every replica dropped"
        running = [x for x in self.replicas if x.status != "dropped"]
        tps = " + ".join("TP" + "/".join(map(str, x.widths[: 1 if len(set(x.widths)) == 1 else None])) for x in running)
        changed = [
            f"replica {i} {x.status}" for i, x in enumerate(self.replicas) if x.status in ("dropped", "replaced")
        ]
        micro = "+".join(str(x.micro_batches) for x in running)
        cp = f", CP{self.spec.cp}" if self.spec.cp > 1 else ""
        return (
            f"{tps} ({', '.join([self.policy, *changed])}), PP{self.spec.pp}{cp}, "
            f"{micro} micro-batches of {self.spec.micro_batch}"
        )


class RunReplanner:
    """Lays out a shrunk run again after failures or repairs (``relayout``); everything that does
    not depend on which processes died is computed once here."""

    def __init__(self, plan: Plan, shrunk: Shrunk, spares: int = 0, max_power: float = 1.3):
        if spares < 0:
            raise ValueError(f"spares {spares} must be zero or more")
        self.plan, self.shrunk, self.spares = plan, shrunk, spares
        self.replanner = Replanner(plan, max_power)  # ntp-pw's largest power multiplier
        self.cluster = plan.cluster.build()
        base = shrunk.spec
        self.n = base.world_size
        self.unit = base.pp if base.vpp > 1 else 1  # micro-batches come in multiples of it (``spec.check``)

    def base(self) -> Layout:
        """The healthy layout: every process at its base rank, the spares idle."""
        base = self.shrunk.spec
        changes = tuple(
            ReplicaChange("healthy", tuple(st.width for st in rep.stages), rep.micro_batches, None)
            for rep in base.replicas[:: base.cp]
        )
        spares = tuple(range(self.n, self.n + self.spares))
        return Layout(base, tuple(range(self.n)), spares, tuple(range(self.n)), changes, "none")

    def relayout(self, slots, alive: frozenset[int], policy: str) -> Layout:
        """The layout when ``slots[b]`` fills base rank ``b`` and the processes in ``alive`` live
        (a slot whose process is not alive is empty). A repaired process put back in its slot
        returns its replica to the base layout."""
        filled = self._filled(slots, alive, policy)
        pool = [p for p in sorted(alive) if p >= self.n and p not in filled]  # idle spare processes
        failed = frozenset(self.shrunk.plan_ranks[b][1] for b, p in enumerate(filled) if p is None) - {None}
        covered = {int(g) for g in in_domain_cover(self.cluster, np.array(sorted(failed), dtype=np.int64))[1]}
        base, changes, pipelines = self.shrunk.spec, [], []
        for i in range(base.data_replicas):
            change, reps = self._replica(i, filled, covered, pool, DECIDER[policy])
            changes.append(change)
            pipelines += reps
        used = sorted(b for rep in pipelines for st in rep.stages for b in st.ranks)
        procs = tuple(filled[b] for b in used)
        idle = tuple(sorted(alive - set(procs)))
        spec = self._spec([self._renumber(rep, used) for rep in pipelines], used) if pipelines else None
        return Layout(spec, procs, idle, tuple(filled), tuple(changes), policy)

    def _filled(self, slots, alive: frozenset[int], policy: str) -> list[int | None]:
        """Slots with dead processes emptied and, under ``spares``, empty ones filled by idle
        spare processes (lowest id first, in base-rank order)."""
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        ids = self.n + self.spares
        placed = [p for p in slots if p is not None]
        if len(slots) != self.n or len(set(placed)) < len(placed) or any(not 0 <= p < ids for p in [*placed, *alive]):
            raise ValueError(
                f"slots must name {self.n} base ranks, each filled by a distinct process id 0..{ids - 1} or None, "
                f"and alive ids 0..{ids - 1}; got {len(slots)} slots {list(slots)} and alive {sorted(alive)}"
            )
        filled = [p if p in alive else None for p in slots]
        if policy == "spares":
            pool = iter(p for p in sorted(alive) if p >= self.n and p not in filled)
            filled = [next(pool, None) if p is None else p for p in filled]
        return filled

    def _replica(self, i: int, filled, covered: set[int], pool: list[int], decider: str):
        """(what data replica ``i`` of the base does, its pipelines over base positions: stage
        ranks are base ranks until ``_renumber``). Spare processes taken from ``pool`` fill the
        empty slots of a replica the plan keeps healthy."""
        base, lay = self.shrunk.spec, self.plan.layout
        slices = base.replicas[i * base.cp : (i + 1) * base.cp]
        survivors = [lay.tp] * lay.pp
        for j, group in enumerate(self.shrunk.stage_groups):
            held = [sum(filled[b] is not None or self._gpu(b) in covered for b in r.stages[j].ranks) for r in slices]
            survivors[group[0]] = min(held)  # run stage j stands for the first plan stage it merges
        out = self.replanner.decide(decider, survivors)
        if out.status == "dropped":
            return ReplicaChange("dropped", (0,) * base.pp, 0, out.reason), []
        empty = [b for b in _positions(slices) if filled[b] is None]
        spared = bool(empty) and out.status == "healthy" and len(pool) >= len(empty)
        for b in empty if spared else ():
            filled[b] = pool.pop(0)
        live = [min(sum(filled[b] is not None for b in r.stages[j].ranks) for r in slices) for j in range(base.pp)]
        plan_tp = (min(out.stage_tp[s] for s in g) for g in self.shrunk.stage_groups)
        widths = tuple(min(t, k) for t, k in zip(plan_tp, live, strict=True))
        if 0 in widths:
            stage = widths.index(0)
            return ReplicaChange("dropped", (0,) * base.pp, 0, f"no live process is left in run stage {stage}"), []
        status = self._status(slices, filled, widths, out.status, spared)
        m = slices[0].micro_batches
        ratio = out.sequences / (lay.num_micro_batches * lay.micro_batch)  # of the plan replica's local batch
        micro = m if status in ("healthy", "replaced") else scaled_micro_batches(ratio, m, self.unit)
        return ReplicaChange(status, widths, micro, self._reason(status, out.reason, slices, filled, widths)), [
            self._pipeline(r, filled, widths, micro) for r in slices
        ]

    def _reason(self, status: str, decided: str | None, slices, filled, widths) -> str | None:
        """The Replanner's reason, or which spares stand in, or why a replica the plan keeps healthy is narrower."""
        if status == "replaced":
            stand_in = [
                (b, filled[b]) for r in slices for st in r.stages for b in st.ranks if (filled[b] or 0) >= self.n
            ]
            return "spare processes stand in at full width: " + ", ".join(f"{p} at base rank {b}" for b, p in stand_in)
        if status == "degraded" and decided is None:  # the plan keeps it healthy (in-domain spares)
            return (
                "the plan covers its failed GPUs with idle GPUs of their NVLink domains, but no spare process is "
                f"left to stand in: stages run at widths {'/'.join(map(str, widths))} with the full batch"
            )
        return decided

    def _status(self, slices, filled, widths, decided: str, spared) -> str:
        full = widths == tuple(st.width for st in slices[0].stages)
        spare = any((filled[b] or 0) >= self.n for b in _positions(slices))
        if full and (spare or spared):
            return "replaced"
        return "healthy" if full and decided == "healthy" else "degraded"

    def _gpu(self, b: int) -> int | None:
        return self.shrunk.plan_ranks[b][1]

    @staticmethod
    def _pipeline(rep: ReplicaSpec, filled, widths, micro: int) -> ReplicaSpec:
        """A pipeline of base positions: each stage's first ``width`` filled positions, its blocks
        as in the base at full width, else every block at the stage's width (``make_spec``'s rule)."""
        stages = []
        for st, w in zip(rep.stages, widths, strict=True):
            ranks = tuple(b for b in st.ranks if filled[b] is not None)[:w]
            blocks = st.blocks if w == st.width else tuple(Block(x.kind, x.layer, w) for x in st.blocks)
            stages.append(StageSpec(ranks, blocks, st.chunk_sizes))
        return ReplicaSpec(tuple(stages), micro, rep.cp_rank)

    @staticmethod
    def _renumber(rep: ReplicaSpec, used: list[int]) -> ReplicaSpec:
        """Base positions -> ranks 0..world-1, in base-rank order."""
        rank = {b: k for k, b in enumerate(used)}
        stages = tuple(dataclasses.replace(st, ranks=tuple(rank[b] for b in st.ranks)) for st in rep.stages)
        return dataclasses.replace(rep, stages=stages)

    def _spec(self, pipelines: list[ReplicaSpec], used: list[int]) -> RunSpec:
        """The base run with these pipelines. ZeRO-3 and expert parallelism need replicas alike
        (``spec.check``): beside replicas of different widths or batches the run drops to ZeRO-2
        (as ``shrink`` does); replicas alike keep the largest divisor of the base's ep whose
        groups the pipelines left fill (``shrink._ep``'s rule). Where that loses the base's ep,
        an MoE run at ZeRO-0 whose pipelines run equal micro-batches keeps its EP groups instead:
        the experts of every process that left go to the survivors of its EP group
        (``hosting.rehost``; whole experts, their state rebuilt from peers), else it runs ep 1."""
        base = self.shrunk.spec
        shape = {(tuple((st.width, tuple(b.degree for b in st.blocks)) for st in r.stages), r.micro_batches)
                 for r in pipelines}  # fmt: skip
        alike = len(shape) == 1
        zero = base.zero if alike or base.zero < 3 else 2
        ep = max(d for d in range(1, base.ep + 1) if base.ep % d == 0 and len(pipelines) % d == 0) if alike else 1
        reshard = base.reshard_after_forward if zero == 3 else True
        spec = dataclasses.replace(base, replicas=tuple(pipelines), zero=zero, ep=ep, reshard_after_forward=reshard)
        hosting = self._hosting(pipelines, used) if ep < base.ep else None
        if hosting is None:
            return spec
        return dataclasses.replace(spec, ep=base.ep, etp=1, hosting=hosting)

    def _hosting(self, pipelines: list[ReplicaSpec], used: list[int]):
        """The base's experts held whole (``hosting.as_hosting``) with every base rank outside
        the new run re-hosted on its EP group's survivors; None where that cannot run: ZeRO,
        an EP group with nobody left; and
        None where every group is down to one rank (each holds every expert: plain ep 1)."""
        base = self.shrunk.spec
        if base.zero or not base.cfg.moe_layers:
            return None
        hosting = as_hosting(base)
        try:
            for b in sorted(set(range(base.world_size)) - set(used), reverse=True):  # highest first: numbers hold
                hosting = rehost(hosting, b)
        except ValueError:
            return None
        kind = {r: rep.micro_batches for rep in pipelines for st in rep.stages for r in st.ranks}
        hosting = lockstep(hosting, kind)  # a degraded replica's fewer micro-batches: EP over its own ranks
        return hosting if max(len(g) for h in hosting for g in h.groups) > 1 else None  # else plain ep 1


def _positions(slices) -> list[int]:
    """Base ranks of the pipelines (a replica's cp slices) of the base run, in stage order."""
    return [b for r in slices for st in r.stages for b in st.ranks]
