"""Tensor parallelism simulated in one process: every rank's parameters sliced by
``parallel.tensor``, its partial outputs summed in place of the all-reduces, gradients placed
back. It checks the sharding math before any process group exists (``test_tensor``); the
distributed executor replaces the sums with collectives. Moved here from ``parallel/tensor.py``,
which only tests used it from."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ntp_planner.executor.model.reference import Reference, add_bias, normed
from ntp_planner.executor.parallel.ownership import layer_shards, vocab_shards
from ntp_planner.executor.parallel.tensor import param_index, rank_attention, rank_layer_params, rank_mlp


def shard_model(ref: Reference, degrees: list[int]) -> dict:
    """Per-rank parameters of every layer at its degree, plus vocab-parallel embedding and head
    (at the first layer's degree) and the replicated final norm and position table."""
    cfg = ref.cfg
    layers = []
    for layer, t in zip(ref.layers, degrees, strict=True):
        shards = layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, t)
        layers.append((shards, [rank_layer_params(layer, t, r, cfg) for r in range(t)]))
    vocab = vocab_shards(cfg.vocab, degrees[0])
    embed = [ref.embed[a:b].detach().clone().requires_grad_(True) for a, b in vocab]
    head = [ref.head[a:b].detach().clone().requires_grad_(True) for a, b in vocab]
    whole = {k: v.detach().clone().requires_grad_(True) for k, v in ref.named_parameters(recurse=False)}
    shapes = {k: v.shape for k, v in ref.named_parameters()}
    return dict(cfg=cfg, layers=layers, vocab=vocab, embed=embed, head=head, whole=whole, shapes=shapes)


def simulated_tp_loss(sharded: dict, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The model's loss computed rank by rank, partials summed in place of the all-reduces
    (row-parallel biases added once after the sum, TP rank 0's copy)."""
    cfg, whole = sharded["cfg"], sharded["whole"]
    x = 0
    for (a, b), table in zip(sharded["vocab"], sharded["embed"], strict=True):
        mine = (tokens >= a) & (tokens < b)
        x = x + table[(tokens - a).clamp(0, b - a - 1)] * mine[..., None]
    x = add_bias(x, {"pos": whole["pos"][: tokens.shape[-1]]} if "pos" in whole else {}, "pos")
    for shards, ranks in sharded["layers"]:
        attn = sum(rank_attention(normed(x, p, "norm1"), p, shards, r, cfg) for r, p in enumerate(ranks))
        x = x + add_bias(attn, ranks[0], "o_bias")
        x = x + add_bias(sum(rank_mlp(normed(x, p, "norm2"), p, cfg) for p in ranks), ranks[0], "down_bias")
    logits = torch.cat([normed(x, whole, "norm") @ w.T for w in sharded["head"]], dim=-1)
    return F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))


def gathered_grads(sharded: dict) -> dict[str, torch.Tensor]:
    """Gradients mapped back to the reference parameters' shapes: slices placed, replicated
    pieces (norms, KV heads cut by an uneven split) summed over the ranks holding them."""
    cfg = sharded["cfg"]
    out = {
        "embed": torch.cat([t.grad for t in sharded["embed"]]),
        "head": torch.cat([t.grad for t in sharded["head"]]),
        **{k: v.grad for k, v in sharded["whole"].items() if k not in ("embed", "head")},
    }
    for i, (shards, ranks) in enumerate(sharded["layers"]):
        full: dict[str, torch.Tensor] = {}
        for r, p in enumerate(ranks):
            for key, t in p.items():
                if t.grad is None:  # a row-parallel bias of a rank other than 0: never used
                    continue
                idx = param_index(cfg, key, shards.degree, r)
                g = full.setdefault(key, torch.zeros(sharded["shapes"][f"layers.{i}.{key}"]))
                if idx is None:
                    g += t.grad
                else:
                    g.index_add_(idx[0], torch.tensor(idx[1]), t.grad)
        out.update({f"layers.{i}.{k}": v for k, v in full.items()})
    return out
