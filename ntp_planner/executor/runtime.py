"""Run replicas of a tiny model with torch.distributed: TP inside a replica (uneven allowed),
data parallel across replicas of possibly different TP degrees (NTP), gradients weighted by
samples, AdamW. Process groups are built once, in the same order on every rank, and passed
explicitly.

Gradient sync the NTP way (shared/reference/ntp.md): inside each replica the gradient is
resharded to the layout of the smallest TP degree n (here: an all-reduce of every rank's
contribution placed in a full-size buffer, which stands in for NVLink all-to-all), core ranks
j < n all-reduce their slice 1:1 with core rank j of every other replica, each replica then
reshards back to its own layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ntp_planner.executor.model import Reference, TinyConfig, rms_norm
from ntp_planner.executor.sharding import layer_shards, vocab_shards
from ntp_planner.executor.shards import head_rows, rank_attention, rank_layer_params, rank_mlp


@dataclass(frozen=True)
class Replica:
    ranks: tuple[int, ...]  # global ranks, TP rank order
    batch: int  # sequences per step


# ---- explicit autograd functions for the TP collectives -------------------------------------------
class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the input gradient backward (column-parallel input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (row-parallel output); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherVocab(torch.autograd.Function):
    """All-gather of uneven vocabulary shards along the last dimension (gloo wants equal
    sizes: pad, gather, trim); backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, group, sizes, rank):
        ctx.rank, ctx.sizes = rank, sizes
        pad = max(sizes) - x.shape[-1]
        padded = F.pad(x, (0, pad))
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([p[..., :n] for p, n in zip(parts, sizes, strict=True)], dim=-1)

    @staticmethod
    def backward(ctx, grad):
        start = sum(ctx.sizes[: ctx.rank])
        return grad[..., start : start + ctx.sizes[ctx.rank]], None, None, None


# ---- one rank's model --------------------------------------------------------------------------
class RankModel:
    """This rank's slices of the reference model at its replica's TP degree."""

    def __init__(self, ref: Reference, degree: int, tp_rank: int):
        cfg = ref.cfg
        self.cfg, self.degree, self.tp_rank = cfg, degree, tp_rank
        self.shards = layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, degree)
        self.layers = [rank_layer_params(layer, self.shards, tp_rank, cfg.head_dim) for layer in ref.layers]
        self.vocab = vocab_shards(cfg.vocab, degree)
        a, b = self.vocab[tp_rank]
        leaf = lambda t: t.detach().clone().requires_grad_(True)  # noqa: E731
        self.embed, self.head, self.norm = leaf(ref.embed[a:b]), leaf(ref.head[a:b]), leaf(ref.norm)

    def parameters(self) -> dict[str, torch.Tensor]:
        out = {"embed": self.embed, "head": self.head, "norm": self.norm}
        for i, p in enumerate(self.layers):
            out.update({f"layers.{i}.{k}": v for k, v in p.items()})
        return out

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, group) -> torch.Tensor:
        cfg, r = self.cfg, self.tp_rank
        a, b = self.vocab[r]
        mine = (tokens >= a) & (tokens < b)
        x = _ReduceFromTP.apply(self.embed[(tokens - a).clamp(0, b - a - 1)] * mine[..., None], group)
        for p in self.layers:
            h = _CopyToTP.apply(rms_norm(x, p["norm1"]), group)
            x = x + _ReduceFromTP.apply(rank_attention(h, p, self.shards, r, cfg), group)
            h = _CopyToTP.apply(rms_norm(x, p["norm2"]), group)
            x = x + _ReduceFromTP.apply(rank_mlp(h, p), group)
        h = _CopyToTP.apply(rms_norm(x, self.norm), group)
        logits = _GatherVocab.apply(h @ self.head.T, group, [e - s for s, e in self.vocab], r)
        return F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))

    # ---- gradient layout: local slices <-> full reference shapes -------------------------------
    def _index(self, name: str, degree: int, rank: int):
        """(dim, index list) of this parameter's slice for ``rank`` at ``degree``; None = whole."""
        cfg = self.cfg
        key = name.split(".")[-1]
        if key in ("embed", "head"):
            s, e = vocab_shards(cfg.vocab, degree)[rank]
            return 0, list(range(s, e))
        if key in ("norm", "norm1", "norm2"):
            return None
        sh = layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, degree)
        d = cfg.head_dim
        table = {
            "q": (0, head_rows(sh.heads[rank], d)),
            "k": (0, head_rows(sh.kv_heads[rank], d)),
            "v": (0, head_rows(sh.kv_heads[rank], d)),
            "o": (1, head_rows(sh.heads[rank], d)),
            "gate": (0, list(range(*sh.ffn[rank]))),
            "up": (0, list(range(*sh.ffn[rank]))),
            "down": (1, list(range(*sh.ffn[rank]))),
        }
        return table[key]

    def contribution(self, name: str, grad: torch.Tensor, shape) -> torch.Tensor:
        """This rank's gradient placed in a zero full-size tensor, each element counted once
        per replica: replicated norms by TP rank 0 only, a KV head cut by an uneven split by its
        first owner (the owners' parts are summed first)."""
        full = torch.zeros(shape, dtype=grad.dtype)
        idx = self._index(name, self.degree, self.tp_rank)
        if idx is None:
            return grad.clone() if self.tp_rank == 0 else full
        dim, rows = idx
        full.index_copy_(dim, torch.tensor(rows), grad)
        return full


def _kv_first_owner_mask(model: RankModel, name: str, shape, degree: int | None = None) -> torch.Tensor:
    """1 on the K/V rows this rank first owns at ``degree`` (its own by default), so KV heads
    that an uneven split gives to two ranks count once."""
    cfg, d = model.cfg, model.cfg.head_dim
    sh = model.shards if degree is None else layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, degree)
    mask = torch.zeros(shape[0], 1)
    for kv in sh.kv_heads[model.tp_rank]:
        if sh.kv_owners(kv)[0] == model.tp_rank:
            mask[kv * d : (kv + 1) * d] = 1
    return mask


def sync_gradients(
    model: RankModel, replicas: list[Replica], me: int, groups: dict, ref_shapes: dict, weighted: bool = True
) -> None:
    """Replace this rank's gradients with the sample-weighted average over all replicas
    (``weighted=False``: the plain mean of replicas, wrong when local batches differ)."""
    total = sum(r.batch for r in replicas)
    rep = replicas[me]
    n = min(len(r.ranks) for r in replicas)
    for name, p in model.parameters().items():
        shape = ref_shapes[name]
        part = model.contribution(name, p.grad, shape)
        if name.split(".")[-1] in ("k", "v"):  # sum the owners of cut KV heads, count once
            dist.all_reduce(part, group=groups["tp"][me])
            part = part * _kv_first_owner_mask(model, name, shape)
        full = part.clone()
        dist.all_reduce(full, group=groups["tp"][me])  # the replica's whole gradient
        full *= rep.batch / total if weighted else 1 / len(replicas)
        # NTP: core rank j keeps slice j of the n-way layout and all-reduces it 1:1 across replicas
        idx = model._index(name, n, model.tp_rank) if model.tp_rank < n else ()
        slice_buf = torch.zeros(shape)
        if model.tp_rank < n:
            if idx is None:
                slice_buf = full.clone()
            else:
                dim, rows = idx
                sel = torch.tensor(rows)
                slice_buf.index_copy_(dim, sel, full.index_select(dim, sel))
                if name.split(".")[-1] in ("k", "v"):  # cut KV heads: one core rank carries each
                    slice_buf = slice_buf * _kv_first_owner_mask(model, name, shape, n)
            dist.all_reduce(slice_buf, group=groups["core"][model.tp_rank])
        # reshard back: rebuild the summed gradient inside the replica, keep this rank's slice
        if model.tp_rank != 0 and idx is None:
            slice_buf.zero_()  # replicated tensors: core rank 0 speaks for the replica
        dist.all_reduce(slice_buf, group=groups["tp"][me])
        mine = model._index(name, model.degree, model.tp_rank)
        p.grad = slice_buf.clone() if mine is None else slice_buf.index_select(mine[0], torch.tensor(mine[1]))


def build_groups(replicas: list[Replica]) -> dict:
    """Every rank creates every group in the same order: each replica's TP group, then one
    1:1 group per core TP rank j < n holding rank j of every replica."""
    tp = [dist.new_group(list(r.ranks)) for r in replicas]
    n = min(len(r.ranks) for r in replicas)
    core = [dist.new_group([r.ranks[j] for r in replicas]) for j in range(n)]
    return {"tp": tp, "core": core}


def run_rank(
    rank: int,
    world: int,
    init_file: str,
    cfg: TinyConfig,
    replicas: list[Replica],
    steps: int,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    out_file: str,
    timeout_s: float = 60,
    dtype: torch.dtype = torch.float32,
    weighted: bool = True,
) -> None:
    """One process: train ``steps`` AdamW steps on this replica's share of the batch and write
    the gathered full parameters and losses (rank 0 of replica 0 writes)."""
    torch.set_num_threads(1)
    torch.set_default_dtype(dtype)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    me = next(i for i, r in enumerate(replicas) if rank in r.ranks)
    tp_rank = replicas[me].ranks.index(rank)
    ref = Reference(cfg, seed=0)
    ref_shapes = {k: v.shape for k, v in ref.named_parameters()}
    groups = build_groups(replicas)
    model = RankModel(ref, len(replicas[me].ranks), tp_rank)
    opt = torch.optim.AdamW(list(model.parameters().values()), lr=1e-2, weight_decay=0.01)
    start = sum(r.batch for r in replicas[:me])
    mine = slice(start, start + replicas[me].batch)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model.loss(tokens[mine], targets[mine], groups["tp"][me])
        loss.backward()
        sync_gradients(model, replicas, me, groups, ref_shapes, weighted)
        opt.step()
        weighted = loss.detach() * replicas[me].batch / tokens.shape[0] * (tp_rank == 0)
        dist.all_reduce(weighted)
        losses.append(weighted.item())
    params = {}
    for name, p in model.parameters().items():
        full = model.contribution(name, p.detach(), ref_shapes[name])
        if name.split(".")[-1] in ("k", "v"):
            full = full * _kv_first_owner_mask(model, name, ref_shapes[name])
        full = full * (me == 0)
        dist.all_reduce(full)
        params[name] = full
    if rank == 0:
        torch.save({"losses": losses, "params": params}, out_file)
    dist.barrier()
    dist.destroy_process_group()


def reference_run(
    cfg: TinyConfig, steps: int, tokens: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype = torch.float32
) -> dict:
    """The same training in one process: the loss is the mean over the whole batch."""
    torch.set_default_dtype(dtype)
    ref = Reference(cfg, seed=0)
    opt = torch.optim.AdamW(list(ref.parameters()), lr=1e-2, weight_decay=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ref.loss(tokens, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in ref.named_parameters()}}
