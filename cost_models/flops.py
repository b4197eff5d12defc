"""FLOPs and memory traffic of every op of one layer, per GPU, for one micro-batch.

Conventions (Narayanan et al. SC'21, appendix): a GEMM of (m x k) by (k x n) costs 2mkn FLOPs;
backward costs twice forward (input gradient + weight gradient). ``tokens`` is the tokens one
GPU holds: micro_batch * seq_len / cp. TP degree ``tp`` splits heads, MLP columns and the
vocabulary; when tp exceeds the KV heads, each rank keeps one replicated KV head.

Each ``Op`` is one kernel of forward; ``fwd`` and ``bwd`` say how many times its cost is paid
in forward and in backward (a GEMM: once and twice; fused attention: once and 2.5 times; the
cast of an output gradient: only in backward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cost_models.model import LayerKind, ModelSpec
from cost_models.training import LOW_PRECISION_BYTES

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
    fwd: float = 1.0  # times its cost is paid in forward
    bwd: float = 2.0  # ... and in backward
    low_precision: bool = True  # a GEMM that runs in the training's fp8/fp4 format (not the LM head)


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads a TP rank holds: kv/tp, or 1 replicated head when tp > kv (Megatron)."""
    return max(1, model.num_kv_heads // tp)


def gemm(name: str, m: int, n: int, k: int, batch: int = 1, low_precision: bool = True) -> Op:
    return Op(
        name=name, kind="gemm", flops=2.0 * m * n * k * batch, m=m, n=n, k=k, batch=batch, low_precision=low_precision
    )


# Bytes per element of one cast to a low-precision format (read 16-bit, write row-wise and
# column-wise copies): Transformer Engine's cast_transpose. Hopper writes both (1 + 1 byte);
# Blackwell reads per-tensor fp8 column-wise and writes one copy; mxfp8 and nvfp4 quantise rows
# and columns separately (plus 1-byte scales per 32 or 16 values), nvfp4 adding a random Hadamard
# transform pass on the weight-gradient operands; neither fuses into the producing kernel (MXFP8
# computes rows and columns from the 16-bit tensor separately: two reads). A cast fused into the
# kernel that produces the tensor (LayerNorm -> QKV/FC1 input, activation -> FC2 input, dact ->
# FC1 output gradient)
# costs nothing extra with delayed scaling; current scaling cannot fuse it (it needs the amax of
# the finished tensor first) and reads every tensor once more for the amax
# (Transformer Engine docs: fp8_current_scaling, performance_considerations).
def cast_bytes(dtype: str, architecture: str, fused: bool, recipe: str) -> float:
    if dtype == "nvfp4":
        return 2 + 2 * LOW_PRECISION_BYTES["nvfp4"] + 2.5
    if dtype == "mxfp8":  # rows and columns are each quantised from the 16-bit tensor: two reads
        return 2 * 2 + 2 * LOW_PRECISION_BYTES["mxfp8"]
    unfused = 2 + 1 + (1 if architecture == "hopper" else 0)
    if recipe == "current":
        return unfused + 2
    return 0.0 if fused else unfused


def cast_ops(
    model: ModelSpec,
    kind: LayerKind,
    tokens: int,
    tp: int,
    sequence_parallel: bool,
    dtype: str,
    architecture: str,
    recipe: str,
) -> list[Op]:
    """The casts a low-precision layer adds: each linear's input in forward, its output gradient
    in backward. Under sequence parallelism the QKV and FC1 inputs are cast on the local
    1/tp of the tokens, then gathered in fp8."""
    h = model.hidden_size
    gathered = tokens / tp if sequence_parallel else tokens
    inputs, grads = _attention_casts(model, tokens, gathered, tp) if kind.attention else ([], [])
    up = 2 if model.gated_mlp else 1
    # (width, copies of each token): a dense MLP; an MoE layer's routed experts see every token
    # top_k times after dispatch, its shared expert once
    mlps = [(model.moe_ffn_hidden_size, model.moe_top_k), (model.moe_shared_ffn_hidden_size, 1)] if kind.moe else []
    for width, copies in mlps or [(kind.ffn, 1)]:
        if width:
            f = width / tp
            # FC1 (after LayerNorm), FC2 (after the activation)
            inputs += [(gathered * copies * h, True), (tokens * copies * f, True)]
            grads += [(tokens * copies * up * f, True), (tokens * copies * h, False)]
    fwd = sum(n * cast_bytes(dtype, architecture, fused, recipe) for n, fused in inputs)
    bwd = sum(n * cast_bytes(dtype, architecture, fused, recipe) for n, fused in grads)
    ops = [Op("cast-inputs", "memory", mem_bytes=fwd, fwd=1.0, bwd=0.0)] if fwd else []
    return ops + ([Op("cast-grads", "memory", mem_bytes=bwd, fwd=0.0, bwd=1.0)] if bwd else [])


def _attention_casts(model: ModelSpec, tokens: int, gathered: float, tp: int) -> tuple[list, list]:
    """(elements, fused) of the attention's cast inputs and output gradients: QKV's input (after
    LayerNorm) and the out-projection's; MLA casts each projection's input: the hidden state for
    the two down-projections, the two latents for the up-projections (whole on every rank), the
    heads' values for the out-projection, and each projection's output gradient."""
    h, heads = model.hidden_size, model.num_heads // tp
    if not model.is_mla:
        q, kvw = model.q_width // tp, 2 * kv_heads_per_rank(model, tp) * model.head_dim
        return [(gathered * h, True), (tokens * q, False)], [(tokens * (q + kvw), False), (tokens * h, False)]
    lq, lkv, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    outs = [lq, lkv + rope, heads * model.head_dim, heads * (model.qk_nope_head_dim + model.v_head_dim), h]
    inputs = [(gathered * h, True)] * 2 + [(tokens * w, False) for w in (lq, lkv)]  # q and kv read h
    inputs.append((tokens * heads * model.v_head_dim, False))
    return [(n, f) for n, f in inputs if n], [(tokens * w, False) for w in outs if w]


def attended_pairs(seq_len: int, window: int = 0) -> float:
    """(query, key) pairs causal attention computes per sequence and head: s^2 / 2 in full
    (the convention of the flash kernel's causal half), s w - w^2 / 2 through a sliding window of
    ``w`` < s tokens (each query sees min(i, w) keys: the ramp of the first w queries, then w
    each). GPT-OSS at s = 4096, w = 128: 516,096 pairs, 1/16.3 of the full 8,388,608.

    >>> attended_pairs(4096), attended_pairs(4096, 128), attended_pairs(100, 200)
    (8388608.0, 516096.0, 5000.0)
    """
    if not window or window >= seq_len:
        return seq_len * seq_len / 2
    return seq_len * window - window * window / 2


def attention_ops(
    model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, flash: bool, window: int = 0
) -> list[Op]:
    """QKV projection (MLA: ``mla_projection_ops``), attention core (QK^T and AV), output
    projection.

    Core FLOPs 4 b s^2 q / (tp cp): counted in full by the MFU convention; a flash kernel
    skips the masked upper triangle, so it executes half. Without flash attention the scores
    go through HBM: scale+mask+softmax reads and writes 2 bytes per score, dropout 5 more.
    A sliding-window layer (``window`` tokens) runs its flash kernel over the window's blocks
    only: ``attended_pairs`` instead of s^2 / 2 (an unfused kernel still computes and masks the
    whole s x s). MLA's scores run over qk_nope + qk_rope dims and its AV over v_head_dim: the
    core executes 2 b a (d_qk + d_v) pairs / (tp cp). Attention sinks add one logit per query and
    head to the softmax: no GEMM work, nothing counted.
    """
    tokens = micro_batch * seq_len // cp
    h, d = model.hidden_size, model.head_dim
    heads = model.num_heads // tp
    kv = kv_heads_per_rank(model, tp)
    dv = model.v_head_dim if model.is_mla else d
    ops = mla_projection_ops(model, tokens, tp) if model.is_mla else [gemm("qkv", tokens, (heads + 2 * kv) * d, h)]
    if model.position == "rope":
        rotated = (heads + 1) * model.qk_rope_head_dim if model.is_mla else (heads + kv) * d
        ops.append(Op("rotary", "memory", mem_bytes=2 * ACT_BYTES * tokens * rotated))
    scores = micro_batch * heads * seq_len * (seq_len // cp)
    if flash:  # executes the causal half of the scores (or the window's band); backward recomputes them
        pairs = micro_batch * heads * attended_pairs(seq_len, window) / cp
        ops.append(Op("attention-core", "flash", flops=2.0 * pairs * (d + dv), bwd=2.5))
        if cp > 1:
            ops.append(cp_correction_op(tokens, heads * dv, kv * d, cp))
    else:
        ops.append(gemm("attention-scores", seq_len // cp, seq_len, d, batch=micro_batch * heads))
        softmax = 4 * scores + (5 * scores if model.dropout else 0)
        ops.append(Op("softmax", "memory", mem_bytes=softmax))
        ops.append(gemm("attention-values", seq_len // cp, dv, seq_len, batch=micro_batch * heads))
    ops.append(gemm("out-proj", tokens, h, heads * dv))
    return ops


def mla_projection_ops(model: ModelSpec, tokens: int, tp: int) -> list[Op]:
    """Multi-head latent attention's projections (DeepSeek-V2, arXiv 2405.04434, eqs. 9-13), as
    Megatron-Core's ``MLASelfAttention`` splits them: the down-projections h -> q_lora_rank and
    h -> kv_lora_rank + qk_rope_head_dim run whole on every TP rank, the up-projections
    q_lora_rank -> a/tp (nope + rope) and kv_lora_rank -> a/tp (nope + v) on the rank's heads
    (no query latent: h -> a/tp (nope + rope) directly), then RMSNorms of the two latents.
    DeepSeek-V3 per token at tp 1: 2 x 7168 x 1536 + 2 x 1536 x 24576 + 2 x 7168 x 576 +
    2 x 512 x 32768 = 139.3 MFLOP."""
    h, heads = model.hidden_size, model.num_heads // tp
    q_in, kv_down = model.q_lora_rank or h, model.kv_lora_rank + model.qk_rope_head_dim
    ops = [gemm("q-down", tokens, model.q_lora_rank, h)] if model.q_lora_rank else []
    ops += [
        gemm("q-up", tokens, heads * model.head_dim, q_in),
        gemm("kv-down", tokens, kv_down, h),
        gemm("kv-up", tokens, heads * (model.qk_nope_head_dim + model.v_head_dim), model.kv_lora_rank),
    ]
    norms = 2 * ACT_BYTES * tokens * (model.q_lora_rank + model.kv_lora_rank)
    return ops + [Op("latent-norms", "memory", mem_bytes=norms)]


def cp_correction_op(tokens: int, q: int, kv: int, cp: int) -> Op:
    """Context parallelism's ring attention (Transformer Engine's ``AttnFuncWithCPAndKVP2P``)
    computes cp partial outputs and merges them. Forward, per output element (``q`` wide) and
    step: the kernel writes the step's 16-bit output (2 bytes), the merge reads it (2) and reads
    and writes the fp32 running output (4 + 4): 12. Backward, per element of the query and
    key/value gradients (q + 2 kv wide) and step: the step's 16-bit gradient (2) and the fp32
    accumulator it is added into, read and written (4 + 4): 10 (the 16-bit gradient is counted
    once, as if the kernel's write and the merge's read were one pass; counted twice, as in
    forward, it would be 12). ``fwd`` counts one unit, ``bwd`` the backward's share of it."""
    fwd = cp * 12.0 * tokens * q
    bwd = cp * 10.0 * tokens * (q + 2 * kv)
    return Op("cp-merge", "memory", mem_bytes=fwd, bwd=bwd / fwd)


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


UNFUSED_ROTARY_BYTES = (24.0, 26.0)
"""Bytes per rotated element (16-bit) of Megatron-Core's unfused rotary embedding, forward and
backward (``rope_utils._apply_rotary_pos_emb_bshd``, taken when ``apply_rope_fusion`` is off).
Forward ``t * cos + _rotate_half(t) * sin`` then ``torch.cat((t, t_pass))``: the negated half
(1 + 1), ``_rotate_half``'s concatenation (2 + 2), the two products (2 + 2 each), their sum (4 + 2)
and the final concatenation (2 + 2): 24. Backward: the gradient times cos and times sin (2 + 2
each), the negated half (1 + 1), the chunk's gradient concatenated (2 + 2), the two paths summed
(4 + 2) and the full-width slice's gradient copied into zeros (2 + 2 + 2): 26. The fused kernel
reads and writes once each way (``attention_ops``' "rotary": 4 forward, 8 backward)."""


def unfused_rotary(op: Op) -> Op:
    """``attention_ops``' fused "rotary" pass as Megatron-Core's unfused rotation
    (``UNFUSED_ROTARY_BYTES``; ``TrainingSpec.rope_fusion`` False): the same rotated elements, 24 / 4 the
    forward bytes and 26 backward.

    >>> op = unfused_rotary(Op("rotary", "memory", mem_bytes=4.0 * 1000))
    >>> op.mem_bytes, op.mem_bytes * op.bwd
    (24000.0, 26000.0)
    """
    fwd, bwd = UNFUSED_ROTARY_BYTES
    elements = op.mem_bytes / (2 * ACT_BYTES)
    return Op(op.name, "memory", mem_bytes=fwd * elements, fwd=op.fwd, bwd=bwd / fwd)


def expert_bias_bytes(probs_bytes: int) -> tuple[float, float]:
    """Bytes per element of the routed rows (hidden wide), forward and backward, that Megatron-Core's
    ``TEGroupedMLP._apply_bias`` moves when the experts have biases (``add_bias_linear``: GPT-OSS;
    ``megatron/core/transformer/moe/experts.py``, "Enable bias in expert mlp [gpt-oss 5/5]",
    2025-09-22, in every release since). fc2 runs with ``skip_bias_add`` and its bias is added per
    expert in eager PyTorch, ``t + b * p`` over the expert's split of the 16-bit output ``t`` with
    the router probability ``p``, then ``torch.cat`` and ``.to(t.dtype)``. ``p`` has the router's
    dtype (16-bit for GPT-OSS, which sets no ``moe_router_dtype``) except behind DeepEP or HybridEP,
    which cast it to fp32 (``token_dispatcher.py``: "DeepEP only supports float32 probs"), so the
    pass runs in ``r = max(2, probs_bytes)`` bytes. Forward: ``b * p`` writes ``r``; the add reads
    2 + ``r`` and writes ``r``; the concatenation reads and writes ``r``; a cast back (fp32 only)
    reads ``r`` and writes 2. Backward: the cast's gradient up and ``t``'s back down (fp32 only,
    2 + ``r`` each); the bias's gradient ``g * p`` written and summed over rows (3 ``r``) and the
    probability's ``g * b`` summed over the hidden dimension (3 ``r``). fc1's bias is in its GEMM
    (``skip_bias_add=False``: cuBLASLt's bias epilogue), so only fc2's pass is extra. Under
    full-iteration CUDA graphs (``TrainingSpec.cuda_graphs``; ``CostEnv._moe_layer_ops`` drops the
    pass) it does not run: the eager split needs each expert's row count on the host, which a graph
    cannot read, and the graphed recipes (Megatron-Bridge v0.5.0 on, GPT-OSS 120B fp8-mx on GB200 /
    GB300: ``cutedsl_fused_grouped_mlp`` / ``use_transformer_engine_op_fuser``) run Megatron-Core's
    fused grouped MLP, whose Transformer Engine ``GroupedLinear`` op holds fc2's bias.

    >>> expert_bias_bytes(2), expert_bias_bytes(4)
    ((12.0, 12.0), (28.0, 36.0))
    """
    r = float(max(2, probs_bytes))
    cast = r != 2.0
    fwd = r + (2 + 2 * r) + 2 * r + cast * (r + 2)
    bwd = 2 * cast * (2 + r) + 6 * r
    return fwd, bwd


def moe_ops(
    model: ModelSpec,
    tokens: int,
    tp: int,
    ep: int,
    etp: int | None = None,
    load: float = 1.0,
    aux_loss: bool = True,
    probs_bytes: int = 2,
) -> list[Op]:
    """One MoE sublayer as Megatron-Core runs it (``cost_models.moe`` describes the steps).

    ``tokens``: the TP group's tokens; under sequence parallelism (which Megatron requires of
    MoE layers with TP) a GPU routes ``tokens / tp`` of them. ``etp`` (None: ``tp``) splits each
    expert's width and gathers the routed rows of its expert-TP group, so one of this GPU's
    ``experts / ep`` experts gets ``tokens / tp x etp x top_k x ep / experts`` rows at mean load,
    times ``load`` (the busiest rank's share, ``moe.imbalance_factor``). Memory passes, per
    forward (backward moves the same):

    - router scores, per (token, expert): the 16-bit logits written (2), read and cast to fp32
      (2 + 4), the score function read and written in fp32 (4 + 4), top-k's read of them and the
      routing map and probabilities it writes (2): 18 bytes; the auxiliary loss reads them once
      more (4) when the router balances with an auxiliary loss (``aux_loss``);
    - permute reads each token and writes it ``top_k`` times, 16-bit (2 x 2 x (1 + top_k) per
      element of hidden); after an expert-TP gather the received rows are sorted again (2 x 2);
      unpermute reads the ``top_k`` rows and writes their weighted sum (the same as permute);
    - the grouped GEMMs are named ``experts-up`` / ``experts-down`` (``CostEnv.op_time`` applies
      the grouped-GEMM efficiency to them);
    - experts with biases (``model.bias``) add fc2's bias outside its GEMM over the received rows
      (``expert_bias_bytes`` of the router probabilities' ``probs_bytes``).
    """
    etp = tp if etp is None else etp
    h, e, k = model.hidden_size, model.num_experts, model.moe_top_k
    t = max(1, tokens // tp)
    local = e // ep
    rows = t * etp * k * ep / e * load
    m, f = max(1, round(rows)), model.moe_ffn_hidden_size // etp
    received = rows * local
    gated = model.gated_mlp
    ops = [
        gemm("router", t, e, h),
        Op("router-score-topk", "memory", mem_bytes=18.0 * t * e, bwd=1.0),
        *([Op("router-aux-loss", "memory", mem_bytes=4.0 * t * e, bwd=1.0)] if aux_loss else []),
        Op("permute", "memory", mem_bytes=2 * 2 * t * h * (1 + k), bwd=1.0),
    ]
    if etp > 1:
        ops.append(Op("permute-etp", "memory", mem_bytes=2 * 2 * received * h, bwd=1.0))
    ops += [
        gemm("experts-up", m, (2 if gated else 1) * f, h, batch=local),
        Op("experts-act", "memory", mem_bytes=(6 if gated else 4) * received * f),
        gemm("experts-down", m, h, f, batch=local),
        Op("unpermute", "memory", mem_bytes=2 * 2 * t * h * (1 + k), bwd=1.0),
    ]
    if model.bias:  # GPT-OSS: fc2's bias, scaled by each row's probability, added outside the GEMM
        fwd_bytes, bwd_bytes = expert_bias_bytes(probs_bytes)
        ops.append(Op("experts-bias", "memory", mem_bytes=fwd_bytes * received * h, bwd=bwd_bytes / fwd_bytes))
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
    dtype: str = "bf16",
    architecture: str = "hopper",
    fp8_recipe: str = "delayed",
    grad_bytes: float = 4.0,
) -> list[Op]:
    """Every op of one transformer layer (an index or a LayerKind) for one micro-batch on one
    GPU: its GEMMs, attention, memory-bound passes, the casts of low-precision training, and the
    accumulation of weight gradients into the main-gradient buffer (Megatron's gradient
    accumulation fusion: the weight-gradient GEMM reads and writes the buffer, ``grad_bytes``
    each way, for every micro-batch)."""
    kind = layer if isinstance(layer, LayerKind) else model.layer_kind(layer)
    tokens = micro_batch * seq_len // cp
    ops = attention_ops(model, micro_batch, seq_len, tp, cp, flash, kind.window) if kind.attention else []
    if kind.moe:
        ops += moe_ops(model, tokens, tp, ep)
    elif kind.ffn:
        ops += mlp_ops(model, tokens, tp, kind.ffn)
    sublayers = kind.attention + (kind.moe or kind.ffn > 0)
    ops += norm_residual_ops(model, tokens, tp if sequence_parallel else 1, sublayers)
    if dtype in LOW_PRECISION_BYTES:
        ops += cast_ops(model, kind, tokens, tp, sequence_parallel, dtype, architecture, fp8_recipe)
    weights = sum(op.n * op.k * op.batch for op in ops if op.kind == "gemm" and not op.name.startswith("attention"))
    ops.append(Op("main-grad-accumulate", "memory", mem_bytes=2 * grad_bytes * weights, fwd=0.0, bwd=1.0))
    return ops


def mtp_ops(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    flash: bool,
    dtype: str = "bf16",
    architecture: str = "hopper",
    fp8_recipe: str = "delayed",
    grad_bytes: float = 4.0,
    fused_cross_entropy: bool = True,
) -> list[Op]:
    """Every op of the multi-token prediction modules, on the last pipeline stage with the output
    layer (Megatron-Core's ``MultiTokenPredictionBlock``; DeepSeek-V3, arXiv 2412.19437 section
    2.2). Each module embeds the tokens one further ahead (the shared embedding, looked up again),
    RMSNorms it and the previous depth's hidden state, projects their concatenation 2h -> h
    (column-parallel), runs one transformer layer, and predicts through the shared output layer
    with its own loss: ``embedding_ops`` + the projection + ``layer_ops`` + ``head_ops``."""
    tokens = micro_batch * seq_len // cp
    h = model.hidden_size
    per_module = [
        Op("mtp-norms", "memory", mem_bytes=2 * 2 * ACT_BYTES * tokens * h),
        gemm("mtp-proj", tokens, h // tp, 2 * h),
        *embedding_ops(model, micro_batch, seq_len, cp, tp, grad_bytes),
        *layer_ops(
            model,
            model.mtp_layer_kind,
            micro_batch,
            seq_len,
            tp,
            cp,
            ep,
            sequence_parallel,
            flash,
            dtype,
            architecture,
            fp8_recipe,
            grad_bytes,
        ),
        *head_ops(model, micro_batch, seq_len, tp, cp, grad_bytes, fused_cross_entropy),
    ]
    return per_module * model.mtp_layers


def padded_vocab(model: ModelSpec, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128 * tp: ceil(V / (128 tp)) * 128 tp."""
    unit = 128 * tp
    return -(-model.vocab_size // unit) * unit


def head_ops(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    cp: int,
    grad_bytes: float = 4.0,
    fused_cross_entropy: bool = True,
) -> list[Op]:
    """Final norm, logits GEMM over the vocabulary shard (16-bit even in fp8 training, as
    Megatron runs the output layer), fp32 cross entropy, and the output weight's gradient
    accumulated into the main-gradient buffer."""
    tokens = micro_batch * seq_len // cp
    vocab = padded_vocab(model, tp) // tp
    accumulate = Op(
        "main-grad-accumulate", "memory", mem_bytes=2 * grad_bytes * vocab * model.hidden_size, fwd=0, bwd=1
    )
    return [accumulate] + [
        Op("final-norm", "memory", mem_bytes=2 * ACT_BYTES * tokens * model.hidden_size),
        gemm("logits", tokens, vocab, model.hidden_size, low_precision=False),
        cross_entropy_op(tokens * vocab, fused_cross_entropy),
    ]


def cross_entropy_op(logits: float, fused: bool) -> Op:
    """Bytes the loss moves per logit.

    Megatron's unfused vocabulary-parallel cross entropy (``tensor_parallel/cross_entropy.py``):
    forward casts the logits to fp32 (read 2, write 4 bytes), takes the max (read 4), subtracts
    it and exponentiates in place (read 4 + write 4, twice), sums (read 4) and normalises in place
    (read 4, write 4): 38 bytes; backward scales the saved softmax and casts it back to 16 bits
    (read 4, write 4, read 4, write 2): 14 bytes. A fused kernel (Transformer Engine's) reads the
    16-bit logits twice (online max and sum, then loss and gradient) and writes the gradient in
    their place: 6 bytes forward, and backward scales it (read 2, write 2): 4 bytes.
    """
    fwd, bwd = (6.0, 4.0) if fused else (38.0, 14.0)
    return Op("cross-entropy", "memory", mem_bytes=fwd * logits, bwd=bwd / fwd)


def embedding_ops(
    model: ModelSpec, micro_batch: int, seq_len: int, cp: int, tp: int = 1, grad_bytes: float = 4.0
) -> list[Op]:
    """Embedding lookup: gather rows and write the activations (no FLOPs). Backward scatters
    the token gradients into a dense 16-bit gradient of the vocabulary shard and accumulates it
    into the main-gradient buffer."""
    tokens = micro_batch * seq_len // cp
    rows = padded_vocab(model, tp) // tp * model.hidden_size
    return [
        Op("embedding", "memory", mem_bytes=2 * ACT_BYTES * tokens * model.hidden_size),
        Op("embedding-grad", "memory", mem_bytes=(ACT_BYTES + 2 * grad_bytes) * rows, fwd=0, bwd=1),
    ]


def model_flops_per_step(model: ModelSpec, seq_len: int, global_batch: int, causal: bool = False) -> float:
    """Model FLOPs of one step (forward + backward, no recompute), the MFU numerator. Attention
    counts the full s x s scores (Narayanan's 72 B L s h^2 (1 + s/6h + V/12hL) for GPT models,
    Megatron-LM up to core 0.11 and NeMo's tables) or, with ``causal``, only their unmasked
    half (Megatron-LM from core 0.12, Megatron-Bridge's tables). A sliding-window layer counts
    the pairs its window attends (``attended_pairs``, doubled in the full convention); MLA its
    projections and d_qk + d_v wide scores; MTP modules their layer, projection and logits."""
    tokens = global_batch * seq_len
    h = model.hidden_size
    moe_mlp = 2 * h * model.num_experts + 2 * model.mlp_matrices * h * (
        model.moe_top_k * model.moe_ffn_hidden_size + model.moe_shared_ffn_hidden_size
    )

    def layer(k: LayerKind) -> float:
        return _attention_flops_per_token(model, seq_len, causal, k.window) * k.attention + (
            moe_mlp if k.moe else 2 * model.mlp_matrices * h * k.ffn
        )

    per_token = sum(n * layer(k) for k, n in model.kind_counts(0, model.num_layers).items())
    per_token += 2 * h * model.vocab_size
    # each MTP module: its layer, the 2h -> h projection and the shared output layer again
    per_token += model.mtp_layers * (layer(model.mtp_layer_kind) + 2 * 2 * h * h + 2 * h * model.vocab_size)
    return 3.0 * tokens * per_token


def _attention_flops_per_token(model: ModelSpec, seq_len: int, causal: bool, window: int) -> float:
    """Forward FLOPs of one token's attention: projections 2 x (their weights) and the core,
    4 s q in the full convention (2 s q causal), over a window's pairs instead of s^2 / 2."""
    h = model.hidden_size
    if model.is_mla:
        m, a = model, model.num_heads
        proj = 2 * (m.q_lora_rank * h if m.q_lora_rank else 0)
        proj += 2 * (m.q_lora_rank or h) * a * m.head_dim + 2 * h * (m.kv_lora_rank + m.qk_rope_head_dim)
        proj += 2 * m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim) + 2 * a * m.v_head_dim * h
        width = a * (m.head_dim + m.v_head_dim) / 2  # QK^T over d_qk, AV over d_v: the mean of the two
    else:
        proj = 2 * h * (model.q_width + 2 * model.kv_width) + 2 * model.q_width * h
        width = model.q_width
    if not window:
        return proj + (2 if causal else 4) * seq_len * width
    per_query = attended_pairs(seq_len, window) / seq_len  # keys one query attends, on average
    return proj + (4 if causal else 8) * per_query * width
