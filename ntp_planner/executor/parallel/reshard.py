"""Which slices of a sharded tensor move between which TP ranks when a replica changes layout
from degree ``src`` to degree ``dst`` (NTP's reshard before and after the 1:1 all-reduce).

Every row (along the parameter's cut dimension) has one canonical holder per layout: its only
owner, or for a KV head that an uneven split gives to two ranks, the first. The canonical
source sends each destination the rows the destination holds; nothing else moves, so a rank
sends at most its own slice.

Worked example, the FFN's up projection (48 columns) from TP4 (12 each) to TP3 (16 each):
rank 0 keeps its 12 and receives 4 from rank 1; rank 1 keeps 8 and sends 4 to rank 0; ...

>>> plan = reshard_plan(TinyConfig(), "up", 4, 3)
>>> {pair: len(pos) for pair, (pos, _) in sorted(plan.items())}
{(0, 0): 12, (1, 0): 4, (1, 1): 8, (2, 1): 8, (2, 2): 4, (3, 2): 12}
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from ntp_planner.executor.parallel.tensor import param_index
from ntp_planner.executor.spec import TinyConfig


def canonical(cfg: TinyConfig, key: str, degree: int) -> dict[int, int]:
    """Row -> the TP rank that speaks for it at ``degree``."""
    owner: dict[int, int] = {}
    for rank in range(degree):
        for row in param_index(cfg, key, degree, rank)[1]:
            owner.setdefault(row, rank)  # ranks in order: a cut KV head's first owner wins
    return owner


Moves = Mapping[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]]


@lru_cache(maxsize=256)
def reshard_plan(cfg: TinyConfig, key: str, src: int, dst: int) -> Moves:
    """(source rank, destination rank) -> (positions in the source's slice, positions in the
    destination's slice) of the rows that move; pairs with nothing to move are left out.
    Read-only (the cache shares it)."""
    speaks = canonical(cfg, key, src)
    src_pos = [{row: i for i, row in enumerate(param_index(cfg, key, src, r)[1])} for r in range(src)]
    out: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for d in range(dst):
        for i, row in enumerate(param_index(cfg, key, dst, d)[1]):
            s = speaks[row]
            pos = out.setdefault((s, d), ([], []))
            pos[0].append(src_pos[s][row])
            pos[1].append(i)
    return MappingProxyType({pair: (tuple(a), tuple(b)) for pair, (a, b) in out.items()})
