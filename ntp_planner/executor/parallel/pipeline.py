"""The 1F1B pipeline schedule of one replica: Megatron's non-interleaved schedule, and with
``vpp`` > 1 its interleaved one (``interleave`` gives the order).

Stage s of P runs min(P - s - 1, m) warm-up forwards, then alternates one forward and one
backward, then drains the remaining backwards. Activations and their gradients travel between
the first ranks of neighbouring stages (a send and a receive to the same neighbour go in one
batch, so the pair cannot deadlock) and are broadcast to the rest of the receiving stage.
"""

from __future__ import annotations

from collections import deque

import torch

from ntp_planner.executor.parallel.comm import Comm
from ntp_planner.executor.parallel.interleave import destination, timeline
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.stage import StageModel


class _Pipe:
    """Point-to-point traffic of one rank with its neighbouring stages."""

    def __init__(self, spec: RunSpec, replica: int, stage: int, rank: int, comm: Comm, like: torch.Tensor):
        stages = spec.replicas[replica].stages
        self.ranks, self.rank, self.comm, self.like = stages[stage].ranks, rank, comm, like
        self.prev = stages[stage - 1].ranks[0] if stage > 0 else None
        self.next = stages[stage + 1].ranks[0] if stage < len(stages) - 1 else None
        start, end = spec.seq_chunk(replica)
        self.shape = (spec.micro_batch, end - start, spec.cfg.hidden)

    def __call__(self, send: torch.Tensor | None, to: int | None, frm: int | None) -> torch.Tensor | None:
        """Send ``send`` to ``to`` and receive from ``frm`` (either may be None); the received
        tensor reaches every rank of this stage."""
        send = send if to is not None else None
        got = None
        # waiting here for a neighbour's activation or gradient is the bubble ("pp", with the
        # broadcast of what arrived to the rest of the stage)
        with self.comm.category("pp"):
            if self.rank == self.ranks[0]:
                got = self.comm.exchange(None if send is None else send.detach(), to, self.shape, frm, self.like)
            if frm is None:
                return None
            if got is None:
                got = torch.empty(self.shape, dtype=self.like.dtype, device=self.like.device)
            return self.comm.broadcast(got, self.ranks[0], self.ranks)


def one_f_one_b(
    model: StageModel, spec: RunSpec, replica: int, stage: int, rank: int, comm: Comm, batch, scale: float
) -> float:
    """Forward and backward of every micro-batch of this replica through this stage; gradients
    accumulate in the parameters. Returns this rank's share of the loss (last stage, TP rank 0
    of each copy; 0 elsewhere)."""
    if spec.vpp > 1:
        return interleaved(model, spec, replica, stage, rank, comm, batch, scale)
    tokens, targets = batch
    rep = spec.replicas[replica]
    P, m, mb = len(rep.stages), rep.micro_batches, spec.micro_batch
    first = spec.first_sequence(replica)
    chunk = slice(*spec.seq_chunk(replica))  # context parallelism: this pipeline's positions
    like = next(t for *_, t in model.named_parameters())
    pipe = _Pipe(spec, replica, stage, rank, comm, like)
    last = stage == P - 1
    head = model.blocks[-1]
    pending: deque = deque()
    loss = 0.0
    count = iter(range(m))

    def forward(x):
        nonlocal loss
        i = next(count)
        rows = slice(first + i * mb, first + (i + 1) * mb)
        if x is not None:
            x.requires_grad_(True)
        y = model.forward(tokens[rows, chunk] if stage == 0 else x, targets[rows, chunk], scale)
        if last and head.tp_rank == 0:
            loss += y.item()
        pending.append((x, y))
        return y

    def backward(grad):
        x, y = pending.popleft()
        y.backward() if last else y.backward(grad)
        return None if x is None else x.grad

    warmup = min(P - stage - 1, m)
    for _ in range(warmup):
        pipe(forward(pipe(None, None, pipe.prev)), pipe.next, None)
    x = pipe(None, None, pipe.prev) if m > warmup else None
    for i in range(m - warmup):
        grad = pipe(forward(x), pipe.next, pipe.next)
        dx = backward(grad)
        x = pipe(dx, pipe.prev, pipe.prev if i < m - warmup - 1 else None)
    for _ in range(warmup):
        pipe(backward(pipe(None, None, pipe.next)), pipe.prev, None)
    return loss


def interleaved(
    model: StageModel, spec: RunSpec, replica: int, stage: int, rank: int, comm: Comm, batch, scale: float
) -> float:
    """``one_f_one_b`` with ``spec.vpp`` virtual chunks per stage: every (micro-batch, chunk)
    forward and backward in Megatron's interleaved order, tick by tick of
    ``interleave.timeline``. After each tick the first ranks of the stages exchange what the
    tick produced, each sending its output and receiving its neighbours' in one batch; every
    stage knows the whole timeline, so the batches match and none waits for a tick that has not
    run (``timeline`` proves the order has no cycle). What arrived is broadcast to the stage."""
    tokens, targets = batch
    rep = spec.replicas[replica]
    P, V, m, mb = len(rep.stages), spec.vpp, rep.micro_batches, spec.micro_batch
    first = spec.first_sequence(replica)
    chunk = slice(*spec.seq_chunk(replica))  # context parallelism: this pipeline's positions
    like = next(t for *_, t in model.named_parameters())
    shape = (mb, chunk.stop - chunk.start, spec.cfg.hidden)
    leaders, ranks = [st.ranks[0] for st in rep.stages], rep.stages[stage].ranks
    head = model.blocks[-1]
    inbox: dict = {}  # action -> its input activation or output gradient, received
    pending: dict = {}  # (micro-batch, chunk) -> (input, output) kept for the backward
    loss = 0.0
    for row in timeline(P, V, m):
        send = None
        if row[stage] is not None:
            kind, i, v = action = row[stage]
            dest = destination(P, V, stage, action)
            if kind == "F":
                x = inbox.pop(action, None)  # None: chunk 0 of stage 0 reads token ids
                rows = slice(first + i * mb, first + (i + 1) * mb)
                if x is not None:
                    x.requires_grad_(True)
                y = model.forward(tokens[rows, chunk] if x is None else x, targets[rows, chunk], scale, chunk=v)
                pending[i, v] = (x, y)
                if dest is None and head.tp_rank == 0:
                    loss += y.item()
                send = y
            else:
                x, y = pending.pop((i, v))
                grad = inbox.pop(action, None)
                y.backward() if grad is None else y.backward(grad)
                send = None if x is None else x.grad
            send = None if dest is None else (send.detach(), leaders[dest[0]])
        routes = [(s, destination(P, V, s, a)) for s, a in enumerate(row) if a is not None]
        arriving = [(leaders[s], d[1]) for s, d in routes if d is not None and d[0] == stage]
        with comm.category("pp"):  # waiting for a neighbour is the bubble
            got = [torch.empty(shape, dtype=like.dtype, device=like.device) for _ in arriving]
            if rank == ranks[0]:
                got = comm.exchange_many([send] if send else [], [frm for frm, _ in arriving], shape, like)
            for (_, action), t in zip(arriving, got, strict=True):
                inbox[action] = comm.broadcast(t, ranks[0], ranks)
    return loss
