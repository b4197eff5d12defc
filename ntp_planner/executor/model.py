"""A small Llama-style decoder, written plainly: the single-process reference every sharded run
is compared with. Embedding, RMSNorm, rotary positions, grouped-query attention through
``scaled_dot_product_attention`` (causal), SwiGLU MLP (a mixture of experts in the layers
``cfg.moe_layers`` names, ``moe``), untied LM head. The loss is the cross-entropy plus the MoE
layers' load-balancing loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ntp_planner.executor.moe import init_moe, moe_reference
from ntp_planner.executor.spec import TinyConfig

__all__ = ["Reference", "TinyConfig"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary(x: torch.Tensor, theta: float, offset: int = 0) -> torch.Tensor:
    """Rotate pairs of channels by position-dependent angles; x is [batch, heads, seq, dim]
    holding positions offset, offset + 1, ... (a context-parallel chunk starts at its offset)."""
    seq, dim = x.shape[-2], x.shape[-1]
    freqs = theta ** (-torch.arange(0, dim, 2, dtype=x.dtype, device=x.device) / dim)
    angles = torch.arange(offset, offset + seq, dtype=x.dtype, device=x.device)[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


class Layer(nn.Module):
    def __init__(self, cfg: TinyConfig, index: int = -1):
        super().__init__()
        self.moe = cfg.is_moe(index)
        d = cfg.head_dim
        self.cfg = cfg
        self.norm1 = nn.Parameter(torch.ones(cfg.hidden))
        self.q = nn.Parameter(torch.randn(cfg.heads * d, cfg.hidden) * 0.1)
        self.k = nn.Parameter(torch.randn(cfg.kv_heads * d, cfg.hidden) * 0.1)
        self.v = nn.Parameter(torch.randn(cfg.kv_heads * d, cfg.hidden) * 0.1)
        self.o = nn.Parameter(torch.randn(cfg.hidden, cfg.heads * d) * 0.1)
        self.norm2 = nn.Parameter(torch.ones(cfg.hidden))
        if self.moe:
            init_moe(self, cfg)
            return
        self.gate = nn.Parameter(torch.randn(cfg.ffn, cfg.hidden) * 0.1)
        self.up = nn.Parameter(torch.randn(cfg.ffn, cfg.hidden) * 0.1)
        self.down = nn.Parameter(torch.randn(cfg.hidden, cfg.ffn) * 0.1)


def attention(x, q_w, k_w, v_w, o_w, n_heads: int, n_kv: int, head_dim: int, theta: float, offset: int = 0):
    """Rotated queries, keys and values of ``n_heads`` query heads sharing ``n_kv`` KV heads
    (in order) for tokens at positions offset, offset + 1, ..."""
    b, s, _ = x.shape
    q = (x @ q_w.T).view(b, s, n_heads, head_dim).transpose(1, 2)
    k = (x @ k_w.T).view(b, s, n_kv, head_dim).transpose(1, 2)
    v = (x @ v_w.T).view(b, s, n_kv, head_dim).transpose(1, 2)
    q, k = rotary(q, theta, offset), rotary(k, theta, offset)
    return q, k, v


def attend(q, k, v, kv_index: list[int], o_w, q_offset: int | None = None):
    """Causal SDPA with each query head using KV head ``kv_index[h]``; returns the output
    projection. ``q_offset``: the queries are positions q_offset, ... of a longer key sequence
    that starts at 0 (context parallelism); None: queries and keys are the same positions."""
    k, v = k[:, kv_index], v[:, kv_index]
    if q_offset is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        rows = torch.arange(q.shape[-2], device=q.device)[:, None] + q_offset
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=rows >= torch.arange(k.shape[-2], device=q.device))
    b, h, s, d = out.shape
    return out.transpose(1, 2).reshape(b, s, h * d) @ o_w.T


def swiglu(x, gate_w, up_w, down_w):
    return (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T


class Reference(nn.Module):
    def __init__(self, cfg: TinyConfig, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = cfg
        self.embed = nn.Parameter(torch.randn(cfg.vocab, cfg.hidden) * 0.1)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden))
        self.head = nn.Parameter(torch.randn(cfg.vocab, cfg.hidden) * 0.1)

    def layer_forward(self, layer: Layer, x: torch.Tensor, aux: list | None = None) -> torch.Tensor:
        """One layer; an MoE layer appends its load-balancing loss to ``aux``."""
        c = self.cfg
        h = rms_norm(x, layer.norm1)
        q, k, v = attention(h, layer.q, layer.k, layer.v, layer.o, c.heads, c.kv_heads, c.head_dim, c.rope_theta)
        group = c.heads // c.kv_heads
        x = x + attend(q, k, v, [i // group for i in range(c.heads)], layer.o)
        if layer.moe:
            y, a = moe_reference(rms_norm(x, layer.norm2), layer, c)
            if aux is not None:
                aux.append(a)
            return x + y
        return x + swiglu(rms_norm(x, layer.norm2), layer.gate, layer.up, layer.down)

    def forward(self, tokens: torch.Tensor, aux: list | None = None) -> torch.Tensor:
        x = self.embed[tokens]
        for layer in self.layers:
            x = self.layer_forward(layer, x, aux)
        return rms_norm(x, self.norm) @ self.head.T

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        aux: list[torch.Tensor] = []
        logits = self(tokens, aux)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)) + sum(aux)
