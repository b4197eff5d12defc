"""The executor's process groups and collectives, passed explicitly (no module globals).

``Comm`` creates every group of a ``RunSpec`` in one order on every rank, skips collectives over
one rank, and records in a shared progress array the collectives it has entered and left, so
the launcher can tell a hung rank (outside any collective) from those waiting for it (inside).

The autograd functions are the TP pair of Megatron-style layers (copy to TP: identity forward,
all-reduce backward; reduce from TP: all-reduce forward, identity backward), the vocabulary
all-gather, the pair that moves the residual stream between the full micro-batch (replicated on
the stage) and the copies of a lower-degree block (each copy its rows), and under sequence
parallelism the all-gather / reduce-scatter pair that replaces the all-reduce (the stream
between TP regions is cut along the sequence, unevenly when the degree does not divide it).

Every collective and point-to-point batch is timed (wall time inside the call, waiting for peers
included) under a category: ``kind=`` where the call is made (the autograd functions below: "tp",
or "cp" for context parallelism's key/value gathers; "ep" for the experts' all-to-alls, ``moe``),
else the ``with comm.category(...)`` around
it ("pp" in the pipeline schedule, "dp" around the gradient sync). Calls under no category (the
run's bookkeeping: losses, gathered parameters) are not timed. On CPU with gloo a call returns
when its data has arrived, so the split is exact; on CUDA, NCCL calls return once enqueued, and
the split needs CUDA events (torch.profiler): this clock then gives launch time only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ntp_planner.executor.groups import process_groups
from ntp_planner.executor.spec import RunSpec

KINDS = ("tp", "cp", "pp", "dp", "ep")  # the categories communication time is split into


class Comm:
    fault = None  # called with the category on entering each collective (``worker``'s fault injection)

    def __init__(self, spec: RunSpec, rank: int, progress=None, timeout: timedelta | None = None):
        self.rank, self.progress, self.entered = rank, progress, 0
        self.spent_s = dict.fromkeys(KINDS, 0.0)  # seconds inside calls of each category, so far
        self._kind: str | None = None  # the category of the enclosing ``category`` block
        self.groups = {}
        for ranks in process_groups(spec):  # every rank, same order
            # ``timeout`` as the default group's: ``new_group`` does not inherit it (gloo's default
            # is 30 minutes), so a rank waiting on a hung peer in a TP group would never time out
            self.groups[ranks] = dist.new_group(list(ranks), timeout=timeout) if len(ranks) > 1 else None

    @contextmanager
    def category(self, kind: str | None) -> Iterator[None]:
        """Time the calls made inside the block (that name no ``kind`` of their own) under ``kind``."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown communication category {kind!r}; one of {KINDS}")
        outer, self._kind = self._kind, kind
        try:
            yield
        finally:
            self._kind = outer

    @contextmanager
    def _counted(self, kind: str | None = None):
        """progress[3 rank + 1] = collectives entered, progress[3 rank + 2] = collectives left:
        a rank blocked inside a collective has entered one more than it has left. The wall time
        inside is added to ``spent_s[kind]`` (``kind`` or the enclosing category; none: untimed)."""
        kind = kind or self._kind
        if self.fault is not None:  # live recovery's injected failure (``worker``): fires before entering
            self.fault(kind)
        self.entered += 1
        if self.progress is not None:
            self.progress[3 * self.rank + 1] = self.entered
        start = time.perf_counter()
        yield
        if kind is not None:
            self.spent_s[kind] += time.perf_counter() - start
        if self.progress is not None:
            self.progress[3 * self.rank + 2] = self.entered

    def all_reduce(self, t: torch.Tensor, ranks: tuple[int, ...], kind: str | None = None) -> torch.Tensor:
        """Sum ``t`` in place over ``ranks`` (one of the spec's groups)."""
        if len(ranks) > 1:
            with self._counted(kind):
                dist.all_reduce(t, group=self.groups[ranks])
        return t

    def world_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        with self._counted():
            dist.all_reduce(t, op=op)
        return t

    def gather_objects(self, obj) -> list | None:
        """Every rank's picklable ``obj``, in rank order, on rank 0 (None on the others); untimed.
        One process keeps its own: a full-size model's holdings are gigabytes to pickle and copy."""
        if dist.get_world_size() == 1:
            return [obj]
        out = [None] * dist.get_world_size() if self.rank == 0 else None
        with self._counted():
            dist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, t: torch.Tensor, src: int, ranks: tuple[int, ...]) -> torch.Tensor:
        if len(ranks) > 1:
            with self._counted():
                dist.broadcast(t, src=src, group=self.groups[ranks])
        return t

    def all_gather(self, t: torch.Tensor, ranks: tuple[int, ...], kind: str | None = None) -> list[torch.Tensor]:
        if len(ranks) == 1:
            return [t]
        parts = [torch.empty_like(t) for _ in ranks]
        with self._counted(kind):
            dist.all_gather(parts, t.contiguous(), group=self.groups[ranks])
        return parts

    def all_to_all(self, t: torch.Tensor, ranks: tuple[int, ...], send: list[int], recv: list[int]) -> torch.Tensor:
        """Rows of ``t`` in blocks of ``send`` sizes, one per rank of ``ranks`` in order; returns
        the blocks of ``recv`` sizes this rank gets from each (category "ep")."""
        out = t.new_empty((sum(recv), *t.shape[1:]))
        with self._counted("ep"):
            dist.all_to_all_single(out, t.contiguous(), recv, send, group=self.groups[ranks])
        return out

    def exchange(self, send: torch.Tensor | None, to: int | None, shape, frm: int | None, like: torch.Tensor):
        """Send ``send`` to rank ``to`` and receive a ``shape`` tensor from ``frm`` together (either
        may be None), as one batch so that neighbours sending to each other cannot deadlock."""
        ops, out = [], None
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send.contiguous(), to))
        if frm is not None:
            out = torch.empty(shape, dtype=like.dtype, device=like.device)
            ops.append(dist.P2POp(dist.irecv, out, frm))
        self._batch(ops)
        return out

    def exchange_many(self, sends: list[tuple[torch.Tensor, int]], frms: list[int], shape, like: torch.Tensor):
        """``exchange`` with several peers at once: send each (tensor, rank) of ``sends`` and
        receive a ``shape`` tensor from each rank of ``frms`` (in that order), as one batch."""
        ops = [dist.P2POp(dist.isend, t.contiguous(), to) for t, to in sends]
        out = [torch.empty(shape, dtype=like.dtype, device=like.device) for _ in frms]
        ops += [dist.P2POp(dist.irecv, buf, frm) for buf, frm in zip(out, frms, strict=True)]
        self._batch(ops)
        return out

    def _batch(self, ops: list) -> None:
        """Run point-to-point sends and receives as one batch and wait for all of them."""
        if ops:
            with self._counted():
                for req in dist.batch_isend_irecv(ops):
                    req.wait()

    def reduce_scatter(self, out: torch.Tensor, chunks: list[torch.Tensor], ranks: tuple[int, ...], kind: str):
        """``out`` = the sum over ``ranks`` of their chunk of this rank's index (equal shapes)."""
        with self._counted(kind):
            dist.reduce_scatter(out, chunks, group=self.groups[ranks])
        return out

    def move(self, src, plan: Mapping, me: int, ranks: tuple[int, ...], dim: int, out_rows: int | None, like):
        """Reshard along ``dim`` by ``plan`` ((source, destination) -> (source positions,
        destination positions), local ranks into ``ranks``): send this rank's pieces of ``src``
        (None: it holds none), receive its new slice of ``out_rows`` rows (None: it holds
        nothing afterwards). ``like`` gives the other dimensions, dtype and device."""
        out = None
        if out_rows is not None:
            shape = list(like.shape)
            shape[dim] = out_rows
            out = like.new_zeros(shape)
        ops, received = [], []
        for (s, d), (src_pos, dst_pos) in plan.items():
            if s == me:
                piece = src.index_select(dim, torch.tensor(src_pos, device=src.device))
                if d == me:
                    out.index_copy_(dim, torch.tensor(dst_pos, device=src.device), piece)
                else:
                    ops.append(dist.P2POp(dist.isend, piece.contiguous(), ranks[d]))
            elif d == me:
                shape = list(like.shape)
                shape[dim] = len(dst_pos)
                buf = like.new_empty(shape)
                ops.append(dist.P2POp(dist.irecv, buf, ranks[s]))
                received.append((buf, dst_pos))
        self._batch(ops)
        for buf, dst_pos in received:
            out.index_copy_(dim, torch.tensor(dst_pos, device=like.device), buf)
        return out


# ---- TP collectives --------------------------------------------------------------------------
class CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the input gradient backward (column-parallel input)."""

    @staticmethod
    def forward(ctx, x, comm: Comm, ranks):
        ctx.comm, ctx.ranks = comm, ranks
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad.clone(), ctx.ranks, "tp"), None, None


class ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (row-parallel output); identity backward."""

    @staticmethod
    def forward(ctx, x, comm: Comm, ranks):
        return comm.all_reduce(x.clone(), ranks, "tp")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class GatherVocab(torch.autograd.Function):
    """All-gather of uneven vocabulary shards along the last dimension (equal sizes on the
    wire: pad, gather, trim); backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, comm: Comm, ranks, sizes, tp_rank):
        ctx.tp_rank, ctx.sizes = tp_rank, sizes
        parts = comm.all_gather(F.pad(x, (0, max(sizes) - x.shape[-1])), ranks, "tp")
        return torch.cat([p[..., :n] for p, n in zip(parts, sizes, strict=True)], dim=-1)

    @staticmethod
    def backward(ctx, grad):
        start = sum(ctx.sizes[: ctx.tp_rank])
        return grad[..., start : start + ctx.sizes[ctx.tp_rank]].contiguous(), None, None, None, None


# ---- the residual stream between the whole stage and the copies of a block ------------------
def _place(part: torch.Tensor, rows: slice, total: int, speaks: bool) -> torch.Tensor:
    """``part`` at ``rows`` of a zero tensor of ``total`` rows; zeros if this rank does not speak
    for its copy (TP rank 0 speaks, so the sum over the stage counts each copy once)."""
    full = part.new_zeros((total, *part.shape[1:]))
    if speaks:
        full[rows] = part
    return full


class EnterCopies(torch.autograd.Function):
    """Forward: this copy's rows of the stage's micro-batch. Backward: the copies' gradients
    assembled into the whole micro-batch on every rank of the stage."""

    @staticmethod
    def forward(ctx, x, comm: Comm, stage_ranks, rows: slice, speaks: bool):
        ctx.comm, ctx.stage_ranks, ctx.rows, ctx.speaks, ctx.total = comm, stage_ranks, rows, speaks, x.shape[0]
        return x[rows].clone()

    @staticmethod
    def backward(ctx, grad):
        full = _place(grad, ctx.rows, ctx.total, ctx.speaks)
        return ctx.comm.all_reduce(full, ctx.stage_ranks, "tp"), None, None, None, None


class ExitCopies(torch.autograd.Function):
    """Forward: the copies' outputs assembled into the whole micro-batch on every rank of the
    stage. Backward: this copy's rows of the gradient."""

    @staticmethod
    def forward(ctx, y, comm: Comm, stage_ranks, rows: slice, total: int, speaks: bool):
        ctx.rows = rows
        return comm.all_reduce(_place(y, rows, total, speaks), stage_ranks, "tp")

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.rows].contiguous(), None, None, None, None, None


# ---- sequence parallelism: the stream between TP regions is cut along the sequence ----------
def _gather_seq(comm: Comm, x: torch.Tensor, ranks, bounds, kind: str = "tp") -> torch.Tensor:
    """All-gather uneven sequence chunks (the second-to-last dimension: [batch, seq, hidden] or
    [batch, heads, seq, head_dim]): pad, gather, trim, concatenate."""
    longest = max(b - a for a, b in bounds)
    padded = F.pad(x, (0, 0, 0, longest - x.shape[-2]))
    parts = comm.all_gather(padded, ranks, kind)
    return torch.cat([p[..., : b - a, :] for p, (a, b) in zip(parts, bounds, strict=True)], dim=-2)


def _reduce_scatter_seq(comm: Comm, x: torch.Tensor, ranks, bounds, j: int, kind: str = "tp") -> torch.Tensor:
    """Sum ``x`` over ``ranks`` and keep chunk ``j`` of the sequence (padded to equal chunks)."""
    if len(ranks) == 1:
        return x.clone()
    longest = max(b - a for a, b in bounds)
    chunks = [F.pad(x[..., a:b, :], (0, 0, 0, longest - (b - a))).contiguous() for a, b in bounds]
    out = comm.reduce_scatter(torch.empty_like(chunks[0]), chunks, ranks, kind)
    a, b = bounds[j]
    return out[..., : b - a, :]


class ScatterSeq(torch.autograd.Function):
    """Replicated stream -> this rank's sequence chunk; backward all-gathers the chunks."""

    @staticmethod
    def forward(ctx, x, comm: Comm, ranks, bounds, j):
        ctx.args = comm, ranks, bounds
        a, b = bounds[j]
        return x[..., a:b, :].clone()

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(*ctx.args[:1], grad, *ctx.args[1:]), None, None, None, None


class GatherSeq(torch.autograd.Function):
    """Chunks -> the replicated stream (stage output); backward keeps this rank's chunk."""

    @staticmethod
    def forward(ctx, x, comm: Comm, ranks, bounds, j):
        ctx.rows = slice(*bounds[j])
        return _gather_seq(comm, x, ranks, bounds)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rows, :].contiguous(), None, None, None, None


class AllGatherSeq(torch.autograd.Function):
    """Chunks -> the whole sequence before a column-parallel layer (``kind`` "tp") or, under
    context parallelism, keys and values for every query chunk ("cp"); backward reduce-scatters
    (every rank's partial use of the whole sequence adds up)."""

    @staticmethod
    def forward(ctx, x, comm: Comm, ranks, bounds, j, kind: str):
        ctx.args = comm, ranks, bounds, j, kind
        return _gather_seq(comm, x, ranks, bounds, kind)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(ctx.args[0], grad, *ctx.args[1:]), None, None, None, None, None


class ReduceScatterSeq(torch.autograd.Function):
    """Partial outputs of a row-parallel layer -> this rank's chunk of their sum; backward
    all-gathers the chunks' gradients."""

    @staticmethod
    def forward(ctx, x, comm: Comm, ranks, bounds, j):
        ctx.args = comm, ranks, bounds
        return _reduce_scatter_seq(comm, x, ranks, bounds, j)

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(ctx.args[0], grad, *ctx.args[1:]), None, None, None, None


class Terminated(RuntimeError):
    """torchrun's agent sent this process SIGTERM: it stops every worker once one has failed."""


def raise_terminated(signum, frame) -> None:
    """A SIGTERM handler: the signal becomes ``Terminated``, so that the rank says what happened."""
    raise Terminated("stopped by torchrun's agent (SIGTERM)")


def lost_peer(exc: BaseException) -> bool:
    """Whether an exception is a collective that lost a peer (failed or timed out), or torchrun's
    agent stopping this process because another failed, not the process's own error: what the
    launcher, live recovery and torchrun's report all ask."""
    text = str(exc).lower()
    return isinstance(exc, (dist.DistError, Terminated)) or any(
        w in text for w in ("gloo", "nccl", "connection", "timed out", "timeout")
    )
