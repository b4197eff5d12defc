"""A small decoder, written plainly: the single-process reference every sharded run is compared
with. Embedding, RMSNorm, rotary positions, grouped-query attention through
``scaled_dot_product_attention`` (causal), SwiGLU MLP (a mixture of experts in the layers
``cfg.moe_layers`` names, ``moe``), untied LM head: Llama-style, the default. ``TinyConfig``
turns on the other families' pieces (``block_params`` lists the parameters): LayerNorm with a
bias, a 2-matrix GELU (GPT) or squared-ReLU (Nemotron) MLP, biases on the linear layers, learned
absolute positions added to the embedding. The loss is the cross-entropy plus the MoE layers'
load-balancing loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ntp_planner.executor.model.activations import ACTIVATIONS
from ntp_planner.executor.model.moe import init_moe, moe_keys, moe_reference
from ntp_planner.executor.spec import TinyConfig

__all__ = ["Reference", "TinyConfig"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def normed(x: torch.Tensor, p: dict, key: str) -> torch.Tensor:
    """Norm ``key`` of the parameters ``p``: LayerNorm when ``p`` holds its bias ``key_bias``,
    else RMSNorm."""
    bias = p.get(f"{key}_bias")
    if bias is None:
        return rms_norm(x, p[key])
    return F.layer_norm(x, x.shape[-1:], p[key], bias, eps=1e-5)


def block_params(cfg: TinyConfig, kind: str, layer: int = -1) -> tuple[str, ...]:
    """Names of the parameters of a block (``embed``, ``layer``, ``head``) under ``cfg``, in the
    order the reference creates them; in an MoE layer (``layer``) the router and experts replace
    the MLP's parameters.

    >>> block_params(TinyConfig(norm="layer", mlp="gelu", bias=True, positions="learned"), "layer")
    ('norm1', 'q', 'k', 'v', 'o', 'norm2', 'up', 'down', 'norm1_bias', 'norm2_bias', 'q_bias', 'k_bias', \
'v_bias', 'o_bias', 'up_bias', 'down_bias')
    """
    layer_norm, gated = cfg.norm == "layer", cfg.mlp == "swiglu"
    if kind == "embed":
        return ("embed", "pos") if cfg.positions == "learned" else ("embed",)
    if kind == "head":
        return ("norm", "head", "norm_bias") if layer_norm else ("norm", "head")
    moe = cfg.is_moe(layer)
    mlp = () if moe else ("gate", "up", "down") if gated else ("up", "down")
    keys = ("norm1", "q", "k", "v", "o", "norm2", *mlp)
    keys += ("norm1_bias", "norm2_bias") if layer_norm else ()
    keys += tuple(f"{k}_bias" for k in ("q", "k", "v", "o", *mlp)) if cfg.bias else ()
    return keys + (moe_keys(cfg) if moe else ())


def rotary(x: torch.Tensor, theta: float, offset: int = 0) -> torch.Tensor:
    """Rotate pairs of channels by position-dependent angles; x is [batch, heads, seq, dim]
    holding positions offset, offset + 1, ... (a context-parallel chunk starts at its offset)."""
    seq, dim = x.shape[-2], x.shape[-1]
    freqs = theta ** (-torch.arange(0, dim, 2, dtype=x.dtype, device=x.device) / dim)
    angles = torch.arange(offset, offset + seq, dtype=x.dtype, device=x.device)[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def zero_gradient_params(cfg: TinyConfig) -> tuple[str, ...]:
    """Layer parameters whose gradient is zero in exact arithmetic, so that what the reference
    and a run compute for it is rounding noise: without rotary positions the key bias adds
    q . b_k to every score of a query, a shift the softmax ignores. (Rotated, the shift varies
    with the key's position and the bias learns.)"""
    return ("k_bias",) if cfg.bias and cfg.positions == "learned" else ()


def _shapes(cfg: TinyConfig) -> dict[str, tuple[int, ...]]:
    q, kv, h, f = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.hidden, cfg.ffn
    weights = {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q), "gate": (f, h), "up": (f, h), "down": (h, f)}
    return {**weights, **{f"{k}_bias": shape[:1] for k, shape in weights.items()}}


class Layer(nn.Module):
    def __init__(self, cfg: TinyConfig, index: int = -1):
        super().__init__()
        self.cfg, self.index, self.moe = cfg, index, cfg.is_moe(index)
        shapes = _shapes(cfg)
        mine = block_params(cfg, "layer", index)
        for key in mine:  # norm weights one, the rest (norm biases too) random; experts last
            if self.moe and key in moe_keys(cfg):
                continue
            ones = key in ("norm1", "norm2")
            value = torch.ones(cfg.hidden) if ones else torch.randn(shapes.get(key, cfg.hidden)) * 0.1
            setattr(self, key, nn.Parameter(value))
        if self.moe:
            init_moe(self, cfg)

    def params(self) -> dict[str, torch.Tensor]:
        return {key: getattr(self, key) for key in block_params(self.cfg, "layer", self.index)}


def attention(x, q_w, k_w, v_w, o_w, n_heads: int, n_kv: int, head_dim: int, theta: float, offset: int = 0,
              biases=None, rope: bool = True):  # fmt: skip
    """Rotated queries, keys and values of ``n_heads`` query heads sharing ``n_kv`` KV heads
    (in order) for tokens at positions offset, offset + 1, ... ``biases``: (q, k, v) biases or
    None; ``rope=False``: not rotated (learned positions are in the stream already)."""
    b, s, _ = x.shape
    qb, kb, vb = biases or (None, None, None)
    q = F.linear(x, q_w, qb).view(b, s, n_heads, head_dim).transpose(1, 2)
    k = F.linear(x, k_w, kb).view(b, s, n_kv, head_dim).transpose(1, 2)
    v = F.linear(x, v_w, vb).view(b, s, n_kv, head_dim).transpose(1, 2)
    if rope:
        q, k = rotary(q, theta, offset), rotary(k, theta, offset)
    return q, k, v


def core_attention(q, k, v, q_offset: int | None = None) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V, causal: what selective recompute recomputes."""
    if q_offset is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    rows = torch.arange(q.shape[-2], device=q.device)[:, None] + q_offset
    return F.scaled_dot_product_attention(q, k, v, attn_mask=rows >= torch.arange(k.shape[-2], device=q.device))


def attend(q, k, v, kv_index: list[int], o_w, q_offset: int | None = None, recompute: bool = False):
    """Causal SDPA with each query head using KV head ``kv_index[h]``; returns the output
    projection (without its bias: a row-parallel bias is added once, after the TP sum).
    ``q_offset``: the queries are positions q_offset, ... of a longer key sequence that starts at
    0 (context parallelism); None: queries and keys are the same positions. ``recompute``: keep
    only q, k, v and recompute the core attention in backward (selective recompute)."""
    k, v = k[:, kv_index], v[:, kv_index]
    if recompute:
        out = checkpoint(core_attention, q, k, v, q_offset, use_reentrant=False)
    else:
        out = core_attention(q, k, v, q_offset)
    b, h, s, d = out.shape
    return out.transpose(1, 2).reshape(b, s, h * d) @ o_w.T


def mlp(cfg: TinyConfig, x: torch.Tensor, p: dict) -> torch.Tensor:
    """The MLP's output projection of ``x`` (without the down bias, added after the TP sum)."""
    if cfg.mlp == "swiglu":
        hidden = F.silu(F.linear(x, p["gate"], p.get("gate_bias"))) * F.linear(x, p["up"], p.get("up_bias"))
    else:
        hidden = ACTIVATIONS[cfg.mlp](F.linear(x, p["up"], p.get("up_bias")))
    return hidden @ p["down"].T


def add_bias(x: torch.Tensor, p: dict, key: str) -> torch.Tensor:
    """``x`` plus the bias ``key`` when the parameters have it (a row-parallel bias: once per sum)."""
    bias = p.get(key)
    return x if bias is None else x + bias


class Reference(nn.Module):
    def __init__(self, cfg: TinyConfig, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = cfg
        self.embed = nn.Parameter(torch.randn(cfg.vocab, cfg.hidden) * 0.1)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden))
        self.head = nn.Parameter(torch.randn(cfg.vocab, cfg.hidden) * 0.1)
        if cfg.norm == "layer":
            self.norm_bias = nn.Parameter(torch.randn(cfg.hidden) * 0.1)
        if cfg.positions == "learned":
            self.pos = nn.Parameter(torch.randn(cfg.max_positions, cfg.hidden) * 0.1)

    def layer_forward(self, layer: Layer, x: torch.Tensor, aux: list | None = None) -> torch.Tensor:
        """One layer; an MoE layer appends its load-balancing loss to ``aux``."""
        c, p = self.cfg, layer.params()
        h = normed(x, p, "norm1")
        biases = (p["q_bias"], p["k_bias"], p["v_bias"]) if c.bias else None
        q, k, v = attention(
            h, p["q"], p["k"], p["v"], p["o"], c.heads, c.kv_heads, c.head_dim, c.rope_theta, 0, biases,
            c.positions == "rope",
        )  # fmt: skip
        group = c.heads // c.kv_heads
        x = x + add_bias(attend(q, k, v, [i // group for i in range(c.heads)], p["o"]), p, "o_bias")
        if layer.moe:
            y, a = moe_reference(normed(x, p, "norm2"), layer, c)
            if aux is not None:
                aux.append(a)
            return x + y
        return x + add_bias(mlp(c, normed(x, p, "norm2"), p), p, "down_bias")

    def forward(self, tokens: torch.Tensor, aux: list | None = None) -> torch.Tensor:
        x = self.embed[tokens]
        if self.cfg.positions == "learned":
            x = x + self.pos[: tokens.shape[-1]]
        for layer in self.layers:
            x = self.layer_forward(layer, x, aux)
        return normed(x, dict(self.named_parameters(recurse=False)), "norm") @ self.head.T

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        aux: list[torch.Tensor] = []
        logits = self(tokens, aux)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)) + sum(aux)
