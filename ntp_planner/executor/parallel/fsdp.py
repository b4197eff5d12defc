"""ZeRO-3 (FSDP) in the executor: between uses a rank holds only its shard of every parameter
slice (``zero``: the AdamW leaf, or its bf16 copy under mixed precision). ZeRO-2 runs the
same way with the parameters kept whole (gathered once per step, after AdamW): only the
gradients are reduce-scattered every micro-batch.

Before a block's forward its slices are all-gathered into full buffers (``Gather``); after it,
with ``reshard_after_forward``, the buffers' storage is freed and gathered again when the
gradient reaches the block's output (``Refill``); otherwise they stay until the block's last
in-flight micro-batch has run its backward. The backward of ``Gather`` is the gradient's
reduce-scatter, once per micro-batch (after the in-copy sums ``data`` does: norms under sequence
parallelism, KV heads an uneven split cut), so only the shard's gradient accumulates.
``StageModel`` calls ``enter`` and ``leave`` around every block (``StageModel.around``).

ZeRO-3 runs where every replica holds a block at one degree with equal micro-batches
(``spec._check_zero``): a gather per micro-batch is a collective every member makes equally often;
ZeRO-2 elsewhere reduces once per step (``optimizer.per_micro_batch``).
"""

from __future__ import annotations

import torch

from ntp_planner.executor.parallel.data import _with_cut_kv_summed
from ntp_planner.executor.parallel.tensor import param_index


class Gather(torch.autograd.Function):
    """Forward: the block's full slices from the shards (``masters``). Backward: the full
    gradients reduce-scattered into the shards' gradients."""

    @staticmethod
    def forward(ctx, z3, bs, *masters):
        ctx.z3, ctx.bs = z3, bs
        if not z3.keep:
            z3.fill(bs)
        z3.in_flight[id(bs)] += 1
        return tuple(s.param.detach() for s in z3.slots[id(bs)])

    @staticmethod
    def backward(ctx, *grads):
        z3, bs = ctx.z3, ctx.bs
        shards = z3.reduce(bs, grads)
        z3.in_flight[id(bs)] -= 1
        if not z3.keep and (z3.reshard or not z3.in_flight[id(bs)]):
            z3.free(bs)
        return None, None, *shards


class Refill(torch.autograd.Function):
    """Identity on a block's output; its backward gathers the block's parameters again."""

    @staticmethod
    def forward(ctx, y, z3, bs):
        ctx.z3, ctx.bs = z3, bs
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.z3.fill(ctx.bs)
        return grad, None, None


class BlockShards:
    """The gather / free / reduce-scatter of one rank's blocks (``engine``: its ``ShardedOptimizer``)."""

    def __init__(self, engine):
        self.engine, self.comm, self.cfg = engine, engine.comm, engine.cfg
        self.reshard = engine.spec.reshard_after_forward
        self.keep = engine.spec.zero < 3  # ZeRO-2: parameters stay whole between uses
        self.slots: dict[int, list] = {}
        for s in engine.slots:
            self.slots.setdefault(id(s.bs), []).append(s)
        self.in_flight = dict.fromkeys(self.slots, 0)
        for bs in engine.model.blocks:
            if not self.keep:
                self.free(bs)

    def enter(self, bs) -> None:
        slots = self.slots[id(bs)]
        full = Gather.apply(self, bs, *(s.master for s in slots))
        bs.params = {s.key: t for s, t in zip(slots, full, strict=True)}

    def leave(self, bs, y: torch.Tensor) -> torch.Tensor:
        if self.keep or not self.reshard:
            return y
        self.free(bs)
        return Refill.apply(y, self, bs)

    def fill(self, bs) -> None:
        """All-gather the block's shards into its full buffers (storage allocated again)."""
        with self.comm.category("dp"), torch.no_grad():
            for s in self.slots[id(bs)]:
                buf = s.param
                buf.untyped_storage().resize_(buf.numel() * buf.element_size())
                got = self.engine._all_gather(s, lambda m, s=s: s.low if s.low is not None else m)
                buf.data.copy_(got.view(buf.shape))  # .data: the saved tensors' version stays

    def free(self, bs) -> None:
        for s in self.slots[id(bs)]:
            s.param.untyped_storage().resize_(0)

    def reduce(self, bs, grads) -> list[torch.Tensor]:
        """One micro-batch's full gradients -> this rank's shards of their sum over the group."""
        out = []
        with self.comm.category("dp"):
            for s, g in zip(self.slots[id(bs)], grads, strict=True):
                g = g.to(s.master.dtype).contiguous()
                if self.engine.model.sp and param_index(self.cfg, s.key, bs.block.degree, bs.tp_rank) is None:
                    self.comm.all_reduce(g, bs.tp_ranks)  # norms saw only this rank's tokens
                g = _with_cut_kv_summed(self.cfg, s.key, bs, g, self.comm, s.full_shape)
                out.append(self.engine._reduce_scatter(s, g)[: s.master.numel()])
        return out

    def materialize(self) -> None:
        """Every block's full parameters, gathered and left in place (for the final comparison)."""
        for bs in self.engine.model.blocks:
            self.fill(bs)
            bs.params = {s.key: s.param for s in self.slots[id(bs)]}
