"""One TP rank's share of a layer: its slices of the weights and its partial outputs.

Column-parallel weights (Q, K, V, gate, up) are cut by rows, row-parallel ones (attention
output, down) by columns, along the same heads / FFN columns (``ownership``), so each rank's
partial output is complete for its units and the partials sum to the layer's output: the sum is
the TP all-reduce. The embedding is split by vocabulary rows (each rank looks up the tokens it
owns; partial embeddings sum) and the LM head by vocabulary rows (partial logits concatenate).
``param_index`` says which indices of a parameter a rank holds; the executor slices, syncs,
reshards and gathers through it.

``simulated_tp_loss`` runs every rank in one process and adds the partials directly: it checks
the sharding math before any process group exists; the distributed executor replaces the sums
with collectives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ntp_planner.executor.model import Reference, TinyConfig, attend, attention, rms_norm, swiglu
from ntp_planner.executor.moe import moe_keys
from ntp_planner.executor.ownership import LayerShards, contiguous, layer_shards, vocab_shards


def head_rows(heads: tuple[int, ...], head_dim: int) -> list[int]:
    return [h * head_dim + i for h in heads for i in range(head_dim)]


# How each parameter is cut: (dimension, what is dealt out) for sharded ones, None = replicated.
CUTS = {
    "embed": (0, "vocab"),
    "head": (0, "vocab"),
    "norm": None,
    "norm1": None,
    "norm2": None,
    "q": (0, "heads"),
    "k": (0, "kv_heads"),
    "v": (0, "kv_heads"),
    "o": (1, "heads"),
    "gate": (0, "ffn"),
    "up": (0, "ffn"),
    "down": (1, "ffn"),
    # MoE layers (``moe``): experts cut along their width at the layer's degree, like the dense MLP
    "router": None,
    "expert_gate": (1, "expert_ffn"),
    "expert_up": (1, "expert_ffn"),
    "expert_down": (2, "expert_ffn"),
    "shared_gate": (0, "shared_ffn"),
    "shared_up": (0, "shared_ffn"),
    "shared_down": (1, "shared_ffn"),
}
BLOCK_PARAMS = {
    "embed": ("embed",),
    "layer": ("norm1", "q", "k", "v", "o", "norm2", "gate", "up", "down"),
    "head": ("norm", "head"),
}


def block_keys(cfg: TinyConfig, block) -> tuple[str, ...]:
    """Parameters of ``block``: an MoE layer's router and experts replace gate, up and down."""
    keys = BLOCK_PARAMS[block.kind]
    if block.kind == "layer" and cfg.is_moe(block.layer):
        return (*keys[:-3], *moe_keys(cfg))
    return keys


def param_index(cfg: TinyConfig, key: str, degree: int, tp_rank: int) -> tuple[int, list[int]] | None:
    """(dimension, indices) of TP rank ``tp_rank``'s slice of parameter ``key`` at ``degree``;
    None when the parameter is replicated.

    >>> param_index(TinyConfig(heads=8, kv_heads=2, hidden=16), "k", 3, 1)  # KV heads 0 and 1, 2 rows each
    (0, [0, 1, 2, 3])
    """
    cut = CUTS[key]
    if cut is None:
        return None
    dim, what = cut
    if what == "vocab":
        a, b = vocab_shards(cfg.vocab, degree)[tp_rank]
        return dim, list(range(a, b))
    if what in ("expert_ffn", "shared_ffn"):
        return dim, list(range(*contiguous(getattr(cfg, what), degree)[tp_rank]))
    sh = layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, degree)
    if what == "ffn":
        return dim, list(range(*sh.ffn[tp_rank]))
    heads = sh.heads[tp_rank] if what == "heads" else sh.kv_heads[tp_rank]
    return dim, head_rows(heads, cfg.head_dim)


def counted_once(cfg: TinyConfig, key: str, degree: int, tp_rank: int, device=None) -> torch.Tensor | float:
    """Weight that makes each element count once when every TP rank's slice is summed into the
    full tensor: replicated parameters by TP rank 0 only, a KV head cut by an uneven split by its
    first owner (a column over the slice's rows)."""
    if CUTS[key] is None:
        return float(tp_rank == 0)
    if key not in ("k", "v"):
        return 1.0
    sh = layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, degree)
    first = [float(sh.kv_owners(kv)[0] == tp_rank) for kv in sh.kv_heads[tp_rank]]
    return torch.tensor(first, device=device).repeat_interleave(cfg.head_dim)[:, None]


def rank_slice(full: torch.Tensor, cfg: TinyConfig, key: str, degree: int, rank: int) -> torch.Tensor:
    """A fresh leaf tensor holding TP rank ``rank``'s slice of parameter ``key`` at ``degree``."""
    idx = param_index(cfg, key, degree, rank)
    t = full.detach() if idx is None else full.detach().index_select(idx[0], torch.tensor(idx[1]))
    return t.clone().requires_grad_(True)


def rank_layer_params(layer, degree: int, rank: int, cfg: TinyConfig) -> dict[str, torch.Tensor]:
    """This rank's slices of a layer (norms are replicated)."""
    return {key: rank_slice(getattr(layer, key), cfg, key, degree, rank) for key in BLOCK_PARAMS["layer"]}


def rank_attention(
    h: torch.Tensor, p: dict, shards: LayerShards, rank: int, cfg: TinyConfig, context=None
) -> torch.Tensor:
    """This rank's partial attention output (its heads through its columns of the output
    projection). ``context`` = (offset, gather) under context parallelism: ``h`` holds the
    positions from ``offset`` on, and ``gather`` brings the keys and values of the whole sequence."""
    heads, kvs = shards.heads[rank], shards.kv_heads[rank]
    offset = context[0] if context else 0
    q, k, v = attention(h, p["q"], p["k"], p["v"], p["o"], len(heads), len(kvs), cfg.head_dim, cfg.rope_theta, offset)
    if context:
        k, v = context[1](k), context[1](v)
    group = cfg.heads // cfg.kv_heads
    return attend(q, k, v, [kvs.index(hd // group) for hd in heads], p["o"], offset if context else None)


def rank_mlp(h: torch.Tensor, p: dict) -> torch.Tensor:
    return swiglu(h, p["gate"], p["up"], p["down"])


def shard_model(ref: Reference, degrees: list[int]) -> dict:
    """Per-rank parameters of every layer at its degree, plus vocab-parallel embedding and head
    (at the first layer's degree)."""
    cfg = ref.cfg
    layers = []
    for layer, t in zip(ref.layers, degrees, strict=True):
        shards = layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, t)
        layers.append((shards, [rank_layer_params(layer, t, r, cfg) for r in range(t)]))
    vocab = vocab_shards(cfg.vocab, degrees[0])
    embed = [ref.embed[a:b].detach().clone().requires_grad_(True) for a, b in vocab]
    head = [ref.head[a:b].detach().clone().requires_grad_(True) for a, b in vocab]
    norm = ref.norm.detach().clone().requires_grad_(True)
    return {"cfg": cfg, "layers": layers, "vocab": vocab, "embed": embed, "head": head, "norm": norm}


def simulated_tp_loss(sharded: dict, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The model's loss computed rank by rank, partials summed in place of the all-reduces."""
    cfg = sharded["cfg"]
    x = 0
    for (a, b), table in zip(sharded["vocab"], sharded["embed"], strict=True):
        mine = (tokens >= a) & (tokens < b)
        x = x + table[(tokens - a).clamp(0, b - a - 1)] * mine[..., None]
    for shards, ranks in sharded["layers"]:
        x = x + sum(rank_attention(rms_norm(x, p["norm1"]), p, shards, r, cfg) for r, p in enumerate(ranks))
        x = x + sum(rank_mlp(rms_norm(x, p["norm2"]), p) for p in ranks)
    h = rms_norm(x, sharded["norm"])
    logits = torch.cat([h @ w.T for w in sharded["head"]], dim=-1)
    return F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))


def gathered_grads(sharded: dict) -> dict[str, torch.Tensor]:
    """Gradients mapped back to the reference parameters' shapes: slices placed, replicated
    pieces (norms, KV heads cut by an uneven split) summed over the ranks holding them."""
    cfg = sharded["cfg"]
    out = {
        "embed": torch.cat([t.grad for t in sharded["embed"]]),
        "head": torch.cat([t.grad for t in sharded["head"]]),
        "norm": sharded["norm"].grad,
    }
    for i, (shards, ranks) in enumerate(sharded["layers"]):
        d = cfg.head_dim
        full = {
            "norm1": torch.zeros(cfg.hidden),
            "norm2": torch.zeros(cfg.hidden),
            "q": torch.zeros(cfg.heads * d, cfg.hidden),
            "k": torch.zeros(cfg.kv_heads * d, cfg.hidden),
            "v": torch.zeros(cfg.kv_heads * d, cfg.hidden),
            "o": torch.zeros(cfg.hidden, cfg.heads * d),
            "gate": torch.zeros(cfg.ffn, cfg.hidden),
            "up": torch.zeros(cfg.ffn, cfg.hidden),
            "down": torch.zeros(cfg.hidden, cfg.ffn),
        }
        for r, p in enumerate(ranks):
            q_rows, kv_rows = head_rows(shards.heads[r], d), head_rows(shards.kv_heads[r], d)
            a, b = shards.ffn[r]
            full["norm1"] += p["norm1"].grad
            full["norm2"] += p["norm2"].grad
            full["q"][q_rows] += p["q"].grad
            full["k"][kv_rows] += p["k"].grad
            full["v"][kv_rows] += p["v"].grad
            full["o"][:, q_rows] += p["o"].grad
            full["gate"][a:b] += p["gate"].grad
            full["up"][a:b] += p["up"].grad
            full["down"][:, a:b] += p["down"].grad
        out.update({f"layers.{i}.{k}": v for k, v in full.items()})
    return out
