"""A stand-in for ``executor.comm.Comm`` inside one process: every collective returns a tensor of
the shape the real one returns, without moving data, so a block runs the executor's own code at
one TP rank's shard shape and its compute alone is timed (``collectives`` times the wire).

The values are not those of a real run (an all-reduce returns this rank's partial sum), which
does not change the work a block does: the kernels and their shapes are the same.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


class LocalComm:
    """``Comm``'s methods that blocks call, as local no-ops of the right shapes (``kind`` names the
    category a real ``Comm`` times the call under; nothing is timed here)."""

    def category(self, kind: str | None):
        return nullcontext()

    def all_reduce(self, t: torch.Tensor, ranks: tuple[int, ...], kind: str | None = None) -> torch.Tensor:
        return t

    def broadcast(self, t: torch.Tensor, src: int, ranks: tuple[int, ...]) -> torch.Tensor:
        return t

    def all_gather(self, t: torch.Tensor, ranks: tuple[int, ...], kind: str | None = None) -> list[torch.Tensor]:
        """``len(ranks)`` parts shaped like ``t``: the same tensor each time (no copy to time; the
        executor's concatenation of the parts still runs and is timed)."""
        return [t for _ in ranks]

    def reduce_scatter(
        self, out: torch.Tensor, chunks: list[torch.Tensor], ranks: tuple[int, ...], kind: str | None = None
    ) -> torch.Tensor:
        return out.copy_(chunks[0])
