"""One TP rank's share of a layer: its slices of the weights and its partial outputs.

Column-parallel weights (Q, K, V, gate, up) are cut by rows, row-parallel ones (attention
output, down) by columns, along the same heads / FFN columns (``ownership``), so each rank's
partial output is complete for its units and the partials sum to the layer's output: the sum is
the TP all-reduce. The embedding is split by vocabulary rows (each rank looks up the tokens it
owns; partial embeddings sum) and the LM head by vocabulary rows (partial logits concatenate).
``param_index`` says which indices of a parameter a rank holds; the executor slices, syncs,
reshards and gathers through it.

Biases follow their weights: a column-parallel bias (Q, K, V, gate, up) is cut like the
weight's rows (a KV head cut by an uneven split: replicated on its owners, its gradient summed
over them, as K and V); a row-parallel bias (attention output, down) is replicated and added
once, after the TP sum, so its gradient is equal on every TP rank (partial per rank under
sequence parallelism, then summed like a norm's). LayerNorm biases and the learned position
table are replicated like the norms; the positions are added once, after the embedding's sum.

The tests' ``tests/support/simulated_tp`` runs every rank in one process and adds the partials
directly: it checks the sharding math before any process group exists; the distributed executor
replaces the sums with collectives.
"""

from __future__ import annotations

import torch

from ntp_planner.executor.model.activations import swiglu
from ntp_planner.executor.model.reference import (
    TinyConfig,
    attend,
    attention,
    block_params,
    mlp,
)
from ntp_planner.executor.parallel.ownership import LayerShards, contiguous, layer_shards, vocab_shards


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
    "pos": None,
    "norm_bias": None,
    "norm1_bias": None,
    "norm2_bias": None,
    "q_bias": (0, "heads"),
    "k_bias": (0, "kv_heads"),
    "v_bias": (0, "kv_heads"),
    "o_bias": None,
    "gate_bias": (0, "ffn"),
    "up_bias": (0, "ffn"),
    "down_bias": None,
    # MoE layers (``moe``): experts cut along their width at the layer's degree, like the dense MLP
    "router": None,
    "expert_gate": (1, "expert_ffn"),
    "expert_up": (1, "expert_ffn"),
    "expert_down": (2, "expert_ffn"),
    "shared_gate": (0, "shared_ffn"),
    "shared_up": (0, "shared_ffn"),
    "shared_down": (1, "shared_ffn"),
}
BLOCK_PARAMS = {  # Llama-style blocks (the default TinyConfig); ``block_params`` for any config
    "embed": ("embed",),
    "layer": ("norm1", "q", "k", "v", "o", "norm2", "gate", "up", "down"),
    "head": ("norm", "head"),
}


def cuts_kv_heads(key: str) -> bool:
    """True for the parameters dealt out by KV head (K, V and their biases)."""
    return CUTS[key] is not None and CUTS[key][1] == "kv_heads"


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


def rank_slice(full: torch.Tensor, cfg: TinyConfig, key: str, degree: int, rank: int) -> torch.Tensor:
    """A fresh leaf tensor holding TP rank ``rank``'s slice of parameter ``key`` at ``degree``."""
    idx = param_index(cfg, key, degree, rank)
    t = full.detach() if idx is None else full.detach().index_select(idx[0], torch.tensor(idx[1]))
    return t.clone().requires_grad_(True)


def rank_layer_params(layer, degree: int, rank: int, cfg: TinyConfig) -> dict[str, torch.Tensor]:
    """This rank's slices of a layer (norms are replicated)."""
    return {key: rank_slice(getattr(layer, key), cfg, key, degree, rank) for key in block_params(cfg, "layer")}


def rank_attention(
    h: torch.Tensor, p: dict, shards: LayerShards, rank: int, cfg: TinyConfig, context=None, recompute: bool = False
) -> torch.Tensor:
    """This rank's partial attention output (its heads through its columns of the output
    projection). ``context`` = (offset, gather) under context parallelism: ``h`` holds the
    positions from ``offset`` on, and ``gather`` brings the keys and values of the whole sequence.
    ``recompute``: the core attention is recomputed in backward (selective recompute)."""
    heads, kvs = shards.heads[rank], shards.kv_heads[rank]
    offset = context[0] if context else 0
    biases = (p["q_bias"], p["k_bias"], p["v_bias"]) if "q_bias" in p else None
    q, k, v = attention(
        h, p["q"], p["k"], p["v"], p["o"], len(heads), len(kvs), cfg.head_dim, cfg.rope_theta, offset, biases,
        cfg.positions == "rope",
    )  # fmt: skip
    if context:
        k, v = context[1](k), context[1](v)
    group = cfg.heads // cfg.kv_heads
    return attend(q, k, v, [kvs.index(hd // group) for hd in heads], p["o"], offset if context else None, recompute)


def rank_mlp(h: torch.Tensor, p: dict, cfg: TinyConfig | None = None) -> torch.Tensor:
    """This rank's partial MLP output (its FFN columns; SwiGLU unless ``cfg`` says otherwise)."""
    if cfg is None:
        return swiglu(h, p["gate"], p["up"], p["down"])
    return mlp(cfg, h, p)
