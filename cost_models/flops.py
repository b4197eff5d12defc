"""FLOPs and memory traffic of every op of one layer, per GPU, for one micro-batch forward.

Conventions (Narayanan et al. SC'21, appendix): a GEMM of (m x k) by (k x n) costs 2mkn FLOPs;
backward costs twice forward (input gradient + weight gradient). ``tokens`` is the tokens one
GPU holds: micro_batch * seq_len / cp. TP degree ``tp`` splits heads, MLP columns and the
vocabulary; when tp exceeds the KV heads, each rank keeps one replicated KV head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cost_models.model import LayerKind, ModelSpec

ACT_BYTES = 2  # activations are 16-bit in fp16, bf16 and fp8 training (fp8 only inside GEMMs)


@dataclass(frozen=True)
class Op:
    """One kernel: a GEMM (m, n, k), fused attention, or a memory-bound pass of ``mem_bytes``."""

    name: str
    kind: Literal["gemm", "flash", "memory"]
    flops: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    mem_bytes: float = 0.0
    batch: int = 1  # independent GEMMs of this shape (attention heads)


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads a TP rank holds: kv/tp, or 1 replicated head when tp > kv (Megatron)."""
    return max(1, model.num_kv_heads // tp)


def gemm(name: str, m: int, n: int, k: int, batch: int = 1) -> Op:
    return Op(name=name, kind="gemm", flops=2.0 * m * n * k * batch, m=m, n=n, k=k, batch=batch)


def attention_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, flash: bool) -> list[Op]:
    """QKV projection, attention core (QK^T and AV), output projection.

    Core FLOPs 4 b s^2 q / (tp cp): counted in full by the MFU convention; a flash kernel
    skips the masked upper triangle, so it executes half. Without flash attention the scores
    go through HBM: scale+mask+softmax reads and writes 2 bytes per score, dropout 5 more.
    """
    tokens = micro_batch * seq_len // cp
    h, d = model.hidden_size, model.head_dim
    heads = model.num_heads // tp
    kv = kv_heads_per_rank(model, tp)
    ops = [gemm("qkv", tokens, (heads + 2 * kv) * d, h)]
    if model.position == "rope":
        ops.append(Op("rotary", "memory", mem_bytes=2 * ACT_BYTES * tokens * (heads + kv) * d))
    scores = micro_batch * heads * seq_len * (seq_len // cp)
    if flash:
        ops.append(Op("attention-core", "flash", flops=2.0 * scores * d))
    else:
        ops.append(gemm("attention-scores", seq_len // cp, seq_len, d, batch=micro_batch * heads))
        softmax = 4 * scores + (5 * scores if model.dropout else 0)
        ops.append(Op("softmax", "memory", mem_bytes=softmax))
        ops.append(gemm("attention-values", seq_len // cp, d, seq_len, batch=micro_batch * heads))
    ops.append(gemm("out-proj", tokens, h, heads * d))
    return ops


def mlp_ops(
    model: ModelSpec,
    tokens: int,
    tp: int,
    width: int,
    name: str = "mlp",
    routed_tokens: int | None = None,
    experts_per_rank: int = 1,
) -> list[Op]:
    """Column-parallel up (and gate) projection, activation, row-parallel down projection."""
    h, f = model.hidden_size, width // tp
    rows = routed_tokens if routed_tokens is not None else tokens
    act = (6 if model.gated_mlp else 4) * rows * f * experts_per_rank  # read 2 or 1 inputs, write 1
    up = (2 if model.gated_mlp else 1) * f
    return [
        gemm(f"{name}-up", rows, up, h, batch=experts_per_rank),
        Op(f"{name}-act", "memory", mem_bytes=act),
        gemm(f"{name}-down", rows, h, f, batch=experts_per_rank),
    ]


def moe_ops(model: ModelSpec, tokens: int, tp: int, ep: int) -> list[Op]:
    """Router, routed experts (balanced load: each expert sees tokens*top_k*ep/experts rows),
    and an optional shared expert."""
    experts_here = model.num_experts // ep
    per_expert = max(1, tokens * model.moe_top_k * ep // model.num_experts)
    ops = [gemm("router", tokens, model.num_experts, model.hidden_size)]
    ops += mlp_ops(model, tokens, tp, model.moe_ffn_hidden_size, "experts", per_expert, experts_here)
    if model.moe_shared_ffn_hidden_size:
        ops += mlp_ops(model, tokens, tp, model.moe_shared_ffn_hidden_size, "shared-expert")
    return ops


def norm_residual_ops(model: ModelSpec, tokens: int, shard: int, sublayers: int = 2) -> list[Op]:
    """Per sublayer (attention, MLP): a norm (read + write 2 bytes) and a residual add (read 2,
    write 1, plus a 1-byte dropout mask). ``shard`` is tp under sequence parallelism, else 1."""
    th = tokens * model.hidden_size / shard
    residual = (3 * ACT_BYTES + (1 if model.dropout else 0)) * th
    return [
        Op("norms", "memory", mem_bytes=sublayers * 2 * ACT_BYTES * th),
        Op("residuals", "memory", mem_bytes=sublayers * residual),
    ]


def layer_ops(
    model: ModelSpec,
    layer: int | LayerKind,
    micro_batch: int,
    seq_len: int,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    flash: bool,
) -> list[Op]:
    """Every op of one transformer layer (an index or a LayerKind) for one micro-batch forward
    on one GPU."""
    kind = layer if isinstance(layer, LayerKind) else model.layer_kind(layer)
    tokens = micro_batch * seq_len // cp
    ops = attention_ops(model, micro_batch, seq_len, tp, cp, flash) if kind.attention else []
    if kind.moe:
        ops += moe_ops(model, tokens, tp, ep)
    elif kind.ffn:
        ops += mlp_ops(model, tokens, tp, kind.ffn)
    sublayers = kind.attention + (kind.moe or kind.ffn > 0)
    ops += norm_residual_ops(model, tokens, tp if sequence_parallel else 1, sublayers)
    return ops


def padded_vocab(model: ModelSpec, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128 * tp: ceil(V / (128 tp)) * 128 tp."""
    unit = 128 * tp
    return -(-model.vocab_size // unit) * unit


def head_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int) -> list[Op]:
    """Final norm, logits GEMM over the vocabulary shard, and fp32 cross entropy (reads the
    logits, writes fp32 softmax: about 10 bytes per logit)."""
    tokens = micro_batch * seq_len // cp
    vocab = padded_vocab(model, tp) // tp
    return [
        Op("final-norm", "memory", mem_bytes=2 * ACT_BYTES * tokens * model.hidden_size),
        gemm("logits", tokens, vocab, model.hidden_size),
        Op("cross-entropy", "memory", mem_bytes=10.0 * tokens * vocab),
    ]


def embedding_ops(model: ModelSpec, micro_batch: int, seq_len: int, cp: int) -> list[Op]:
    """Embedding lookup: gather rows and write the activations (no FLOPs)."""
    tokens = micro_batch * seq_len // cp
    return [Op("embedding", "memory", mem_bytes=2 * ACT_BYTES * tokens * model.hidden_size)]


def model_flops_per_step(model: ModelSpec, seq_len: int, global_batch: int) -> float:
    """Model FLOPs of one step (forward + backward, no recompute, full s^2 attention), the MFU
    numerator. For GPT models this is Narayanan's 72 B L s h^2 (1 + s/6h + V/12hL)."""
    tokens = global_batch * seq_len
    h = model.hidden_size
    attn = 2 * h * (model.q_width + 2 * model.kv_width) + 2 * model.q_width * h + 4 * seq_len * model.q_width
    moe_mlp = 2 * h * model.num_experts + 2 * model.mlp_matrices * h * (
        model.moe_top_k * model.moe_ffn_hidden_size + model.moe_shared_ffn_hidden_size
    )
    per_token = sum(
        n * (attn * k.attention + (moe_mlp if k.moe else 2 * model.mlp_matrices * h * k.ffn))
        for k, n in model.kind_counts(0, model.num_layers).items()
    )
    per_token += 2 * h * model.vocab_size
    return 3.0 * tokens * per_token
