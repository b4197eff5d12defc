"""One rank's part of one pipeline stage: its slices of every block and the forward pass of a
micro-batch through them.

Between blocks the residual stream is the stage's whole micro-batch, replicated on every rank of
the stage. A block at a lower degree than the stage width runs on copies (``spec``): the stream
enters the copies (each takes its rows) before it and leaves them (rows reassembled) after it;
consecutive blocks at the same degree stay on their copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ntp_planner.executor.groups import expert_seat
from ntp_planner.executor.model.moe import EXPERT_KEYS
from ntp_planner.executor.model.reference import Reference, add_bias, block_params, normed
from ntp_planner.executor.parallel.comm import (
    AllGatherSeq,
    Comm,
    CopyToTP,
    EnterCopies,
    ExitCopies,
    GatherSeq,
    GatherVocab,
    ReduceFromTP,
    ReduceScatterSeq,
    ScatterSeq,
)
from ntp_planner.executor.parallel.expert import ExpertPlace, rank_moe
from ntp_planner.executor.parallel.ownership import LayerShards, contiguous, layer_shards, vocab_shards
from ntp_planner.executor.parallel.tensor import rank_attention, rank_mlp, rank_slice
from ntp_planner.executor.spec import Block, RunSpec, StageSpec


@dataclass
class BlockState:
    block: Block
    tp_rank: int
    copy: int
    tp_ranks: tuple[int, ...]  # this copy's TP group
    rows: slice  # this copy's rows of a micro-batch
    shards: LayerShards | None
    params: dict[str, torch.Tensor]  # key -> leaf tensor


class StageModel:
    """This rank's blocks of its stage, sliced from the reference model."""

    seat = None  # MoE layers: where the rank sits for the experts (``groups.expert_seat``)
    around = None  # ZeRO-2/3 (``fsdp.BlockShards``): gathers a block's parameters, reduce-scatters gradients

    def __init__(self, spec: RunSpec, stage: StageSpec, rank: int, ref: Reference, comm: Comm, device):
        self.spec, self.stage, self.comm, self.cfg = spec, stage, comm, spec.cfg
        # sequence parallelism where every block runs at the stage width (Megatron's case);
        # stages with lower-degree copies keep the all-reduce
        self.sp = spec.sequence_parallel and stage.width > 1 and all(b.degree == stage.width for b in stage.blocks)
        replica, s = spec.locate(rank)
        start, end = spec.seq_chunk(replica)
        local = stage.ranks.index(rank)
        self.sp_args = (comm, stage.ranks, contiguous(end - start, stage.width), local)
        # context parallelism: this pipeline holds positions [start, end); attention gathers
        # the keys and values of every chunk from the same position in the other cp slices
        self.context = None
        if spec.cp > 1:
            args = (
                comm,
                spec.cp_group(replica, s, local),
                contiguous(spec.seq_len, spec.cp),
                spec.replicas[replica].cp_rank,
            )
            self.context = (start, lambda t: AllGatherSeq.apply(t, *args, "cp"))
        self.experts, self.aux_values, self._aux_scale = None, [], 0.0  # MoE layers (``moe``)
        if self.cfg.moe_layers:
            seat = self.seat = expert_seat(spec, rank, stage.blocks[0].degree)  # its EP group and experts
            cp_ranks = spec.cp_group(replica, s, local) if spec.cp > 1 else (rank,)
            self.experts = ExpertPlace(
                self.cfg, comm, seat.ep_ranks, seat.ep_rank, cp_ranks, spec.seq_len, seat.owned, seat.etp
            )
        full = dict(ref.named_parameters())
        self.blocks: list[BlockState] = []
        for b in stage.blocks:
            copy, j = stage.position(rank, b.degree)
            per = spec.micro_batch * b.degree // stage.width
            params = {}
            for key in block_params(self.cfg, b.kind, b.layer):
                name = f"{b.name}.{key}" if b.kind == "layer" else key
                if key in EXPERT_KEYS:  # this EP rank's experts, its expert-TP slice of them
                    t = rank_slice(full[name], self.cfg, key, *self.expert_cut(b.degree, j)).detach()
                    t = t[list(self.seat.mine)].clone()
                else:
                    t = rank_slice(full[name], self.cfg, key, b.degree, j).detach()
                params[key] = t.to(device).requires_grad_(True)
            shards = layer_shards(self.cfg.heads, self.cfg.kv_heads, self.cfg.ffn, b.degree)
            self.blocks.append(
                BlockState(
                    b,
                    j,
                    copy,
                    stage.copy_tp_groups(b.degree)[copy],
                    slice(copy * per, (copy + 1) * per),
                    shards,
                    params,
                )
            )

    def expert_cut(self, degree: int, tp_rank: int) -> tuple[int, int]:
        """(slices, slice) of each expert's width this rank holds in a layer at ``degree``: the
        expert grid's etp, or before folding the layer's own TP slice."""
        return (degree, tp_rank) if self.seat.etp is None else (self.seat.etp, self.seat.etp_rank)

    def named_parameters(self):
        """(reference name, key, block state, tensor) of every parameter this rank holds."""
        for bs in self.blocks:
            for key, t in bs.params.items():
                name = f"{bs.block.name}.{key}" if bs.block.kind == "layer" else key
                yield name, key, bs, t

    def chunk(self, v: int) -> list[BlockState]:
        """This rank's blocks of virtual chunk ``v``, in the order the chunk runs them."""
        start = sum(len(c) for c in self.stage.chunks[:v])
        blocks = self.blocks[start : start + len(self.stage.chunks[v])]
        return blocks

    # ---- forward ----------------------------------------------------------------------------
    def forward(
        self, x: torch.Tensor, targets: torch.Tensor | None, loss_scale: float, chunk: int | None = None
    ) -> torch.Tensor:
        """Stage output for one micro-batch: the residual stream, or on the last stage the loss
        of this rank's copy, summed over its tokens and multiplied by ``loss_scale``. ``x`` is
        the token ids on the first stage. With ``chunk``, only that virtual chunk's blocks run
        (interleaving): the stream enters and leaves the chunk replicated on the whole stage."""
        blocks = self.blocks if chunk is None else self.chunk(chunk)
        self._aux_scale = loss_scale  # MoE layers scale their load-balancing loss like the loss
        if self.sp:
            return self._forward_sp(x, targets, loss_scale, blocks)
        width, comm, ranks = self.stage.width, self.comm, self.stage.ranks
        total = x.shape[0]
        current: BlockState | None = None  # block whose copies hold the stream; None = whole stage
        for bs in blocks:
            on_copies = bs.block.degree < width
            same = current is not None and on_copies and current.block.degree == bs.block.degree
            if not same:
                if current is not None:
                    x = ExitCopies.apply(x, comm, ranks, current.rows, total, current.tp_rank == 0)
                current = None
                if on_copies:
                    x = (
                        x[bs.rows]
                        if bs.block.kind == "embed"
                        else EnterCopies.apply(x, comm, ranks, bs.rows, bs.tp_rank == 0)
                    )
                    current = bs
            self._enter(bs)
            if bs.block.kind == "embed":
                x = self._leave(bs, self._embed(bs, x))
            elif bs.block.kind == "layer":
                x = self._leave(bs, self._run(self._layer, bs, x))
            else:
                rows = bs.rows if current is not None else slice(None)
                h = CopyToTP.apply(normed(x, bs.params, "norm"), self.comm, bs.tp_ranks)
                return self._leave(bs, self._loss(bs, h, targets[rows]) * loss_scale)
        if current is not None:
            x = ExitCopies.apply(x, comm, ranks, current.rows, total, current.tp_rank == 0)
        return x

    def _forward_sp(self, x: torch.Tensor, targets: torch.Tensor, loss_scale: float, blocks) -> torch.Tensor:
        """As ``forward``, the stream between TP regions cut along the sequence: all-gather
        before column-parallel layers, reduce-scatter after row-parallel ones."""
        args = self.sp_args
        for i, bs in enumerate(blocks):
            self._enter(bs)
            if bs.block.kind == "embed":
                x = ReduceScatterSeq.apply(self._embed_partial(bs, x), *args)
                x = self._leave(bs, self._positions(bs, x, args[2][args[3]][0]))  # this rank's piece of the sequence
                continue
            if i == 0:
                x = ScatterSeq.apply(x, *args)
            if bs.block.kind == "layer":
                x = self._leave(bs, self._run(self._layer_sp, bs, x))
            else:
                h = AllGatherSeq.apply(normed(x, bs.params, "norm"), *args, "tp")
                return self._leave(bs, self._loss(bs, h, targets) * loss_scale)
        return GatherSeq.apply(x, *args)

    def _enter(self, bs: BlockState) -> None:
        if self.around is not None:
            self.around.enter(bs)

    def _leave(self, bs: BlockState, y: torch.Tensor) -> torch.Tensor:
        """The block's output (ZeRO-3: its parameters freed, to be gathered again for backward)."""
        return y if self.around is None else self.around.leave(bs, y)

    def _run(self, layer, bs: BlockState, x: torch.Tensor) -> torch.Tensor:
        """One layer, its activations recomputed in backward under full recompute."""
        return checkpoint(layer, bs, x, use_reentrant=False) if self.spec.recompute == "full" else layer(bs, x)

    def _attention(self, bs: BlockState, h: torch.Tensor) -> torch.Tensor:
        """This rank's partial attention output; its core recomputed under selective recompute."""
        selective = self.spec.recompute == "selective"
        return rank_attention(h, bs.params, bs.shards, bs.tp_rank, self.cfg, self.context, selective)

    @staticmethod
    def _row_parallel(partial: torch.Tensor, p: dict, key: str, reduce) -> torch.Tensor:
        """``reduce`` (the TP sum) of a row-parallel layer's partial outputs, plus its bias ``key``
        once: after the sum, so every TP rank adds it to the same total."""
        return add_bias(reduce(partial), p, key)

    def _layer_sp(self, bs: BlockState, x: torch.Tensor) -> torch.Tensor:
        p, args = bs.params, self.sp_args
        reduce = lambda t: ReduceScatterSeq.apply(t, *args)  # noqa: E731
        h = AllGatherSeq.apply(normed(x, p, "norm1"), *args, "tp")
        x = x + self._row_parallel(self._attention(bs, h), p, "o_bias", reduce)
        h = AllGatherSeq.apply(normed(x, p, "norm2"), *args, "tp")
        return x + self._row_parallel(self._mlp(bs, h, h, 1 / len(bs.tp_ranks)), p, "down_bias", reduce)

    def _embed_partial(self, bs: BlockState, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary rows looked up (zeros for the others' tokens)."""
        a, b = vocab_shards(self.cfg.vocab, bs.block.degree)[bs.tp_rank]
        mine = (tokens >= a) & (tokens < b)
        return bs.params["embed"][(tokens - a).clamp(0, b - a - 1)] * mine[..., None]

    def _embed(self, bs: BlockState, tokens: torch.Tensor) -> torch.Tensor:
        return self._positions(bs, ReduceFromTP.apply(self._embed_partial(bs, tokens), self.comm, bs.tp_ranks))

    def _positions(self, bs: BlockState, x: torch.Tensor, piece: int = 0) -> torch.Tensor:
        """``x`` plus the learned embeddings of its positions (when the model has them), added
        once after the vocabulary sum: the context-parallel chunk's offset, plus ``piece``, the
        offset of this rank's piece of the chunk under sequence parallelism."""
        if "pos" not in bs.params:
            return x
        start = (self.context[0] if self.context else 0) + piece
        return x + bs.params["pos"][start : start + x.shape[1]]

    def _layer(self, bs: BlockState, x: torch.Tensor) -> torch.Tensor:
        p, g, comm = bs.params, bs.tp_ranks, self.comm
        reduce = lambda t: ReduceFromTP.apply(t, comm, g)  # noqa: E731
        h = CopyToTP.apply(normed(x, p, "norm1"), comm, g)
        x = x + self._row_parallel(self._attention(bs, h), p, "o_bias", reduce)
        route_in = normed(x, p, "norm2")
        h = CopyToTP.apply(route_in, comm, g)
        return x + self._row_parallel(self._mlp(bs, h, route_in, 1.0), p, "down_bias", reduce)

    def _mlp(self, bs: BlockState, h: torch.Tensor, route_in: torch.Tensor, router_scale: float) -> torch.Tensor:
        """This rank's partial MLP output: dense, or a mixture of experts (``expert.rank_moe``; the
        load-balancing loss of each copy is reported by its TP rank 0)."""
        if not self.cfg.is_moe(bs.block.layer):
            return rank_mlp(h, bs.params, self.cfg)
        sink = self.aux_values if bs.tp_rank == 0 else None
        return rank_moe(h, route_in, bs.params, self.experts, bs.tp_ranks, router_scale, self._aux_scale, sink)

    def take_aux(self) -> float:
        """This rank's share of the load-balancing losses since the last call (scaled like the loss)."""
        total, self.aux_values[:] = sum(self.aux_values), []
        return total

    def _loss(self, bs: BlockState, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of the vocabulary-parallel LM head on the normed stream ``h``."""
        sizes = [e - s for s, e in vocab_shards(self.cfg.vocab, bs.block.degree)]
        logits = GatherVocab.apply(h @ bs.params["head"].T, self.comm, bs.tp_ranks, sizes, bs.tp_rank)
        return F.cross_entropy(logits.reshape(-1, self.cfg.vocab), targets.reshape(-1), reduction="sum")
