"""RankGrid: the one rank order of the project, as pure arithmetic.

Ranks are numbered ``tp`` fastest, then ``cp``, then ``dp``, then ``pp`` (Megatron's default order
"tp-cp-ep-dp-pp"; ``ep`` does not change the numbering, it regroups the flattened ``cp x dp``
ranks). A rank and its coordinates are related by

    rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))

so the ranks laid out as an array of shape ``(pp, dp, cp, tp)`` are ``arange(world_size)``
(picotron's grid, Megatron's ``RankGenerator``). Placement, re-planning, the Megatron export and
the executor ask this object for ranks, coordinates and groups instead of writing the formula out.

Worked example, tp=2, dp=2, pp=2 on 8 GPUs:

>>> g = RankGrid(tp=2, dp=2, pp=2)
>>> g.groups("tp")
((0, 1), (2, 3), (4, 5), (6, 7))
>>> g.groups("dp")
((0, 2), (1, 3), (4, 6), (5, 7))
>>> g.groups("pp")  # the pipelines: rank 0 sends to rank 4
((0, 4), (1, 5), (2, 6), (3, 7))
>>> g.rank(tp=1, dp=1, pp=1), g.coords(7)
(7, Coords(tp=1, cp=0, dp=1, pp=1))
>>> g.array("dp", "pp", "tp")[1]  # replica 1: its stages (rows) and TP ranks (columns)
array([[2, 3],
       [6, 7]])

Expert parallelism regroups the ``cp x dp`` ranks of each (tp, pp) position, flattened cp
fastest (index ``cp_i + cp * dp_i``): an EP group takes ``ep`` consecutive ones, the expert
data-parallel group every ``ep``-th. With tp=1, cp=2, dp=2 (4 ranks, flattened index = rank):

>>> e = RankGrid(cp=2, dp=2)
>>> e.ep_group(2, 3), e.expert_dp_group(2, 3)
((2, 3), (1, 3))

Parallel folding (Megatron's MoE "parallel folding", arXiv 2504.14960): the experts use a grid of
their own over the same ranks of each pipeline stage, expert-TP (``etp``) fastest, then ``ep``,
then the expert data-parallel ranks (``edp``), numbered over the stage's ``tp x cp x dp`` ranks
in rank order (Megatron's expert order "tp-ep-dp-pp"). With ``etp = tp`` this is the grouping
above; with ``etp = 1`` an EP group may span the attention TP ranks. tp=4, dp=2, ep=8, etp=1:
the eight ranks of a stage split the experts, each expert whole on one rank:

>>> f = RankGrid(tp=4, dp=2)
>>> f.expert_group("ep", 5, ep=8, etp=1), f.expert_group("etp", 5, ep=8, etp=1)
((0, 1, 2, 3, 4, 5, 6, 7), (5,))
>>> f.expert_group("ep", 5, ep=2, etp=2), f.expert_group("edp", 5, ep=2, etp=2)
((5, 7), (1, 5))
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Axis = Literal["tp", "cp", "dp", "pp"]
ExpertAxis = Literal["etp", "ep", "edp"]
AXES: tuple[Axis, ...] = get_args(Axis)  # fastest-varying first
GroupAxis = Literal["tp", "cp", "dp", "pp", "dp_cp"]


class Coords(NamedTuple):
    """Coordinates of one rank on every axis."""

    tp: int
    cp: int
    dp: int
    pp: int


class RankGrid(BaseModel):
    """Degrees of the four rank-numbering axes; every rank computation of the project."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(default=1, ge=1, description="Tensor-parallel degree; consecutive ranks.")
    cp: int = Field(default=1, ge=1, description="Context-parallel degree; ranks tp apart.")
    dp: int = Field(default=1, ge=1, description="Data-parallel replicas; ranks tp * cp apart.")
    pp: int = Field(default=1, ge=1, description="Pipeline stages; ranks tp * cp * dp apart.")

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def sizes(self) -> dict[str, int]:
        """Degree of each axis, fastest-varying first."""
        return {a: getattr(self, a) for a in AXES}

    def stride(self, axis: Axis) -> int:
        """Distance between ranks one step apart on ``axis``: 1, tp, tp * cp, tp * cp * dp."""
        return math.prod(getattr(self, a) for a in AXES[: AXES.index(axis)])

    def rank(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The rank at these coordinates: tp + self.tp * (cp + self.cp * (dp + self.dp * pp))."""
        coords = Coords(tp, cp, dp, pp)
        for axis, i in zip(AXES, coords, strict=True):
            if not 0 <= i < getattr(self, axis):
                raise IndexError(f"{axis} coordinate {i} is outside 0..{getattr(self, axis) - 1}")
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def coords(self, rank: int) -> Coords:
        """The coordinates of ``rank`` (the inverse of ``rank``)."""
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} is outside 0..{self.world_size - 1}")
        rest, tp = divmod(rank, self.tp)
        rest, cp = divmod(rest, self.cp)
        pp, dp = divmod(rest, self.dp)
        return Coords(tp, cp, dp, pp)

    def array(self, *axes: Axis) -> np.ndarray:
        """Ranks indexed by the coordinates of ``axes`` in that order (all four by default,
        slowest first: ``[pp, dp, cp, tp]``). Axes left out are taken at coordinate 0."""
        axes = axes or AXES[::-1]
        if len(set(axes)) != len(axes) or not set(axes) <= set(AXES):
            raise ValueError(f"axes {axes} must be distinct names from {AXES}")
        full = np.arange(self.world_size, dtype=np.int64).reshape(self.pp, self.dp, self.cp, self.tp)
        picked = full[tuple(slice(None) if a in axes else 0 for a in AXES[::-1])]
        kept = [a for a in AXES[::-1] if a in axes]
        return picked.transpose([kept.index(a) for a in axes])

    def group(self, axis: GroupAxis, rank: int) -> tuple[int, ...]:
        """Ranks that share every coordinate of ``rank`` but those of ``axis``, ascending
        (``dp_cp``: Megatron's data-parallel group with context parallelism, dp x cp ranks)."""
        c = self.coords(rank)
        varying = ("dp", "cp") if axis == "dp_cp" else (axis,)
        fixed = {a: slice(None) if a in varying else getattr(c, a) for a in AXES}
        full = self.array()
        return tuple(int(r) for r in np.sort(full[tuple(fixed[a] for a in AXES[::-1])], axis=None))

    def groups(self, axis: GroupAxis) -> tuple[tuple[int, ...], ...]:
        """Every group of ``axis``, ordered by their lowest rank."""
        varying = ("dp", "cp") if axis == "dp_cp" else (axis,)
        others = [a for a in AXES[::-1] if a not in varying]
        members = [a for a in AXES[::-1] if a in varying]
        table = self.array(*others, *members).reshape(-1, math.prod(getattr(self, a) for a in members))
        return tuple(tuple(int(r) for r in row) for row in table)

    def _flat(self, ep: int, rank: int) -> tuple[np.ndarray, int]:
        """The ``cp x dp`` ranks at ``rank``'s (tp, pp), flattened cp fastest, and ``rank``'s index."""
        if self.cp * self.dp % ep:
            raise ValueError(f"ep {ep} does not divide cp({self.cp}) x dp({self.dp}) = {self.cp * self.dp}")
        c = self.coords(rank)
        flat = self.array("pp", "dp", "cp", "tp")[c.pp, :, :, c.tp].reshape(-1)
        return flat, c.cp + self.cp * c.dp

    def ep_group(self, ep: int, rank: int) -> tuple[int, ...]:
        """The ``ep`` ranks that split the experts with ``rank``: consecutive in the flattened
        ``cp x dp`` ranks of its (tp, pp) (Megatron's order "tp-cp-ep-dp-pp"), ascending."""
        flat, i = self._flat(ep, rank)
        return tuple(int(r) for r in flat[i - i % ep : i - i % ep + ep])

    def expert_dp_group(self, ep: int, rank: int) -> tuple[int, ...]:
        """Ranks holding the same experts as ``rank``: every ``ep``-th of the flattened ``cp x dp``
        ranks of its (tp, pp), from its place in its EP group, ascending."""
        flat, i = self._flat(ep, rank)
        return tuple(int(r) for r in flat[i % ep :: ep])

    def expert_group(self, axis: ExpertAxis, rank: int, ep: int, etp: int | None = None) -> tuple[int, ...]:
        """The ranks that share every expert-grid coordinate of ``rank`` but ``axis``, ascending.

        The expert grid numbers the ``tp x cp x dp`` ranks of ``rank``'s stage in rank order as
        ``etp`` fastest, then ``ep``, then ``edp = tp * cp * dp / (etp * ep)`` (``etp`` None: the
        attention's ``tp``). ``etp``: the ranks splitting each expert's matrices; ``ep``: the ranks
        splitting the experts; ``edp``: the ranks holding the same expert shard."""
        etp = self.tp if etp is None else etp
        width = self.tp * self.cp * self.dp
        if etp < 1 or ep < 1 or width % (etp * ep):
            raise ValueError(
                f"etp({etp}) * ep({ep}) = {etp * ep} does not divide tp({self.tp}) x cp({self.cp}) x dp({self.dp}) "
                f"= {width}"
            )
        self.coords(rank)  # range check
        base, local = divmod(rank, width)
        grid = np.arange(width, dtype=np.int64).reshape(width // (etp * ep), ep, etp)  # [edp, ep, etp]
        edp_i, rest = divmod(local, etp * ep)
        ep_i, etp_i = divmod(rest, etp)
        picked = {"etp": grid[edp_i, ep_i, :], "ep": grid[edp_i, :, etp_i], "edp": grid[:, ep_i, etp_i]}[axis]
        return tuple(int(r) + base * width for r in picked)

    def expert_groups(self, axis: ExpertAxis, ep: int, etp: int | None = None) -> tuple[tuple[int, ...], ...]:
        """Every group of the expert-grid ``axis``, ordered by their lowest rank."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world_size):
            seen.setdefault(self.expert_group(axis, r, ep, etp))
        return tuple(sorted(seen))


def rehost_experts(owner: list[int], members: list[int], lost: set[int]) -> list[int]:
    """Each expert's holder in one EP group after the ``lost`` members leave it: their experts,
    in expert order, each to the surviving member holding the fewest, the lowest rank on a tie
    (the re-planner's and the executor's one rule). ``owner``: per expert id, its holder.

    >>> rehost_experts([0, 0, 1, 1, 2, 2], [0, 1, 2], {1})
    [0, 0, 0, 2, 2, 2]
    """
    survivors = [r for r in members if r not in lost]
    if not survivors:
        raise ValueError(f"every member of the EP group {members} is lost: nobody can take its experts")
    held = {r: sum(o == r for o in owner) for r in survivors}
    out = list(owner)
    for e, r in enumerate(owner):
        if r in lost:
            to = min(survivors, key=lambda s: (held[s], s))
            out[e], held[to] = to, held[to] + 1
    return out
