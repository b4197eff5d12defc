"""Bytes per GPU: weights, gradients, optimizer state; and activations.

Weights/gradients/optimizer per parameter follow Megatron-Core's distributed-optimizer table
(docs/source/api-guide/dist_optimizer.md): fp16 params with fp16 grads keep 2 + 2 bytes plus 16
bytes of fp32 state (main param, main grad, Adam m and v); bf16 params keep 2 + 4 (fp32 grads)
plus 12 (main param, m, v). The distributed optimizer shards that fp32 state over d DP ranks:
20 -> 4 + 16/d and 18 -> 6 + 12/d.

Activations follow Korthikanti et al. 2022 (arXiv 2205.05198), section 4, generalised tensor by
tensor so GQA, SwiGLU, no-dropout and flash attention are covered: for GPT with dropout this
gives exactly s b h (10 + 24/t + 5 a s / (h t)) per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.flops import ACT_BYTES, kv_heads_per_rank, padded_vocab
from cost_models.model import LayerKind, ModelSpec
from cost_models.training import LOW_PRECISION_BYTES


@dataclass(frozen=True)
class StateBytes:
    """Per-GPU bytes of model state."""

    weights: float
    grads: float
    optimizer: float
    low_precision_weights: float = 0.0  # fp8/fp4 copies of the GEMM weights (Transformer Engine's cache)

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.low_precision_weights


def optimizer_bytes_per_param(grad_bytes: float, precision_aware: bool = False) -> float:
    """Adam's state per parameter: fp32 master weight, m and v (12 bytes), plus an fp32 copy of
    the gradient when gradients are kept in 16 bits (Megatron's table: 16 for fp16). A
    precision-aware optimizer keeps 16-bit remainders of the master weights (which with the
    16-bit weights make them whole) and reads 16-bit gradients directly: 2 + 4 + 4 bytes."""
    if precision_aware:
        return 10.0
    return 12.0 + (4.0 if grad_bytes < 4 else 0.0)


def state_bytes(
    params: float,
    dtype: str,
    dp: int,
    distributed_optimizer: bool | None = None,
    *,
    zero: int | None = None,
    grad_bytes: float | None = None,
    param_bytes: float = 2.0,
    lp_copy_bytes: float = 0.0,
    gemm_params: float = 0.0,
    precision_aware: bool = False,
) -> StateBytes:
    """Weights, gradients, Adam state and low-precision weight copies for ``params`` parameters
    held by one GPU, ``dp`` data-parallel ranks sharing them (dp x cp, times in-stage copies).

    ZeRO level (Megatron-FSDP's sharding strategies): 0 keeps everything on every rank, 1 shards
    the optimizer state (the distributed optimizer), 2 also the gradients, 3 also the weights.
    Megatron's table for bf16 with fp32 gradients: 18 bytes per parameter, 6 + 12/d with the
    distributed optimizer; fp16 with fp16 gradients: 20 and 4 + 16/d.
    ``gemm_params`` of them are GEMM weights, which low-precision training caches at
    ``lp_copy_bytes`` each.
    """
    level = zero if zero is not None else (1 if distributed_optimizer else 0)
    grad = grad_bytes if grad_bytes is not None else (2.0 if dtype == "fp16" else 4.0)
    opt = optimizer_bytes_per_param(grad, precision_aware)
    return StateBytes(
        weights=param_bytes * params / (dp if level >= 3 else 1),
        grads=grad * params / (dp if level >= 2 else 1),
        optimizer=opt * params / (dp if level >= 1 else 1),
        low_precision_weights=lp_copy_bytes * gemm_params / (dp if level >= 3 else 1),
    )


def saved_input_bytes(dtype: str) -> float:
    """Bytes per element a linear layer saves of its input for the weight gradient: 16-bit, or
    Transformer Engine's column-wise low-precision cast of it (fp8 1; mxfp8 1 + a scale byte per
    32 values; nvfp4 half a byte + a scale byte per 16, after the random Hadamard transform)."""
    return LOW_PRECISION_BYTES.get(dtype, ACT_BYTES)


def low_precision_copy_bytes(dtype: str, architecture: str, fp8_params: bool) -> float:
    """Bytes per GEMM weight that Transformer Engine keeps besides the weight itself: the cast
    copy it reuses across micro-batches (``is_first_microbatch``), row-wise for forward and
    column-wise (transposed) for the input gradient. Hopper needs the transpose stored; Blackwell
    reads per-tensor fp8 column-wise natively; block-scaled formats quantise rows and columns
    separately (scales: 1 byte per 32 values for mxfp8, per 16 for nvfp4). With low-precision
    primary weights (``fp8_params``) the row-wise copy is the weight itself.
    """
    if dtype not in LOW_PRECISION_BYTES:
        return 0.0
    rows = cols = LOW_PRECISION_BYTES[dtype]
    if dtype == "fp8" and architecture != "hopper":
        cols = 0.0
    return cols if fp8_params else rows + cols


def embedding_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Word embeddings split over tp (padded vocabulary) plus replicated learned positions."""
    word = padded_vocab(model, tp) * model.hidden_size / tp
    return word + (model.embedding_params - model.vocab_size * model.hidden_size)


def head_params_per_gpu(model: ModelSpec, tp: int, separate_stage: bool) -> float:
    """Final norm plus the output layer split over tp. A tied output layer on a stage of its own
    (pp > 1) keeps its own copy of the embedding (Megatron); on the embedding's stage it is free."""
    word = padded_vocab(model, tp) * model.hidden_size / tp
    untied = 0 if model.tie_embeddings else model.vocab_size * model.hidden_size
    return model.head_params - untied + (word if not model.tie_embeddings or separate_stage else 0.0)


def stage_params(
    model: ModelSpec,
    layers: range,
    tp: int,
    ep: int,
    first: bool,
    last: bool,
    pp: int,
    etp: int | None = None,
) -> float:
    """Parameters one GPU of a pipeline stage holds. Norms, row-parallel biases and learned
    positions are replicated over TP; everything else is split tp ways, the routed experts etp * ep
    ways (``etp`` None: tp, experts split over the attention's TP ranks)."""
    total = sum(
        n * layer_params_per_gpu(model, kind, tp, ep, etp)
        for kind, n in model.kind_counts(layers.start, layers.stop).items()
    )
    total += embedding_params_per_gpu(model, tp) if first else 0.0
    if last:
        total += head_params_per_gpu(model, tp, pp > 1) + mtp_params_per_gpu(model, tp, ep, pp > 1, etp)
    return total


def mtp_params_per_gpu(model: ModelSpec, tp: int, ep: int, separate_stage: bool, etp: int | None = None) -> float:
    """The MTP modules on the last stage, per GPU: each a transformer layer (``layer_params_per_gpu``),
    its 2h -> h projection split over tp and three RMSNorms whole. They look the next tokens up in
    the shared embedding: a last stage of its own (pp > 1) holds a copy of it (Megatron-Core builds
    the embedding on the last stage for MTP, as for a tied output layer; with tied embeddings the
    head's copy serves both).

    DeepSeek-V3 at tp 1, ep 64 on a stage of its own: 11.27B / 64 = 0.18B routed, 0.34B else (attention,
    shared expert, router, projection, norms), 0.93B of embedding copy: 1.44B."""
    if not model.mtp_layers:
        return 0.0
    h = model.hidden_size
    module = layer_params_per_gpu(model, model.mtp_layer_kind, tp, ep, etp) + 2 * h * h / tp
    module += model.mtp_module_params - model.layer_params(model.mtp_layer_kind) - 2 * h * h
    copy = padded_vocab(model, tp) * h / tp if separate_stage and not model.tie_embeddings else 0.0
    return model.mtp_layers * module + copy


def layer_params_per_gpu(model: ModelSpec, kind: LayerKind, tp: int, ep: int, etp: int | None = None) -> float:
    """Parameters of one layer of ``kind`` on one GPU at TP degree ``tp``: attention, router, shared
    expert and dense MLP split over tp; the routed experts over etp * ep (parallel folding: the
    experts' own grid, ``etp`` None = tp), each expert's matrices etp ways and the experts ep ways.

    DeepSeek-V3 at tp 2, ep 64, etp 1: an MoE layer's 256 experts of 44.0M parameters go 4 to a GPU,
    whole (176M), where etp = tp would halve them again over the two attention TP ranks."""
    whole = model.layer_tp_replicated_params(kind)
    experts = model.layer_expert_params(kind)
    etp = tp if etp is None else etp
    return (model.layer_params(kind) - whole - experts) / tp + whole + experts / (etp * ep)


def activation_bytes_per_layer(
    model: ModelSpec,
    layer: int,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    flash: bool,
    cp: int = 1,
    linear_input_bytes: float = ACT_BYTES,
    etp: int | None = None,
    modules: tuple[str, ...] = (),
) -> float:
    """Bytes one layer stores for backward, for one micro-batch on one GPU.

    Tensors saved (Korthikanti Fig. 4 and 5), with T = b s / cp tokens, t = tp:
    replicated over TP unless sequence parallel: norm inputs 2 x 2Th, QKV and MLP inputs
    2 x 2Th, dropout masks 2 x Th; split over TP: Q, K, V, output-projection input, MLP
    activation input(s) and down-projection input; core attention (dropped by selective
    recompute): scores 2 a s T, dropout mask and output 3 a s T, or only the log-sum-exp of a
    flash kernel. Full recompute keeps only the layer input, 2Th (split under SP).

    Low-precision training (``linear_input_bytes`` from ``saved_input_bytes``, 1 for fp8):
    Transformer Engine saves the inputs of its linear layers as their low-precision (column-wise)
    cast, for the weight gradient: the QKV, MLP and down-projection inputs take that many bytes;
    the attention output is kept in 16 bits for the fused attention's backward and, besides, as
    the output projection's low-precision input.

    ``modules`` (Megatron's recompute_modules, recomputed in backward) drop what they would save:
    ``layernorm`` the norms' 16-bit outputs (the linear inputs of the replicated terms; in
    low precision Transformer Engine keeps its own cast for the weight gradient, so nothing), ``mla_up_proj``
    MLA's up-projected Q, K and V (the latents stay), ``mlp`` a dense MLP's activation input(s)
    and down-projection input (its input stays), ``moe_act`` the experts' down-projection input.
    """
    kind = layer if isinstance(layer, LayerKind) else model.layer_kind(layer)
    tokens = micro_batch * seq_len / cp
    h, d = model.hidden_size, model.head_dim
    rep_div = tp if sequence_parallel else 1
    if recompute == "full":
        return ACT_BYTES * tokens * h / rep_div
    lin = linear_input_bytes
    extra_out = lin if lin < ACT_BYTES else 0.0  # the out-projection's own low-precision input
    drop = 1 if model.dropout else 0
    sublayers = kind.attention + (kind.moe or kind.ffn > 0)
    norm_out = 0.0 if "layernorm" in modules and lin >= ACT_BYTES else lin  # a low-precision cast stays
    replicated = sublayers * (ACT_BYTES + norm_out + drop) * tokens * h
    heads, kv = model.num_heads // tp, kv_heads_per_rank(model, tp)
    dv = model.v_head_dim if model.is_mla else d
    split = 0.0
    if kind.attention:
        if not (model.is_mla and "mla_up_proj" in modules):
            split += ACT_BYTES * tokens * (heads + kv) * d + ACT_BYTES * tokens * kv * dv
        split += (ACT_BYTES + extra_out) * tokens * heads * dv
        split += mla_latent_bytes(model, tokens, lin)
    up = 2 if model.gated_mlp else 1  # up-projection outputs saved for the activation's backward
    if kind.moe:
        routed, f = routed_rows_per_gpu(model, tokens, tp, etp), model.moe_ffn_hidden_size / (etp or tp)
        down_in = 0.0 if "moe_act" in modules else lin
        split += lin * routed * h + (up * ACT_BYTES + down_in) * routed * f
        if model.moe_shared_ffn_hidden_size:
            split += (up * ACT_BYTES + lin) * tokens * model.moe_shared_ffn_hidden_size / tp
    elif kind.ffn and "mlp" not in modules:
        split += (up * ACT_BYTES + lin) * tokens * kind.ffn / tp
    if not kind.attention:
        core = 0.0
    elif flash:
        core = 4.0 * tokens * heads  # fp32 log-sum-exp per query and head
    else:
        scores = micro_batch * heads * seq_len * seq_len / cp
        core = ACT_BYTES * scores + (3 * scores if drop else 0)
    if recompute == "selective":  # core attention recomputed: its output is not kept in 16 bits
        core = -(ACT_BYTES * tokens * heads * dv if kind.attention and extra_out else 0.0)
    return replicated / rep_div + split + core


def routed_rows_per_gpu(model: ModelSpec, tokens: float, tp: int, etp: int | None = None) -> float:
    """Token copies an MoE layer's routed experts hold on one GPU, balanced: a stage's cp x dp
    TP groups of ``tokens`` each route top_k copies of every token to tp x cp x dp / etp expert-TP
    groups, each of whose etp GPUs keeps every row it receives (its matrices' 1/etp share):
    tokens x top_k x etp / tp. With etp = tp every TP rank holds all its group's tokens' copies;
    folded to etp 1 over tp 8, an eighth of them, each through a whole expert.

    >>> from cost_models import MODELS
    >>> routed_rows_per_gpu(MODELS["mixtral-8x7b"], 4096, 8), routed_rows_per_gpu(MODELS["mixtral-8x7b"], 4096, 8, 1)
    (8192.0, 1024.0)
    """
    etp = tp if etp is None else etp
    return tokens * model.moe_top_k * etp / tp


def mla_latent_bytes(model: ModelSpec, tokens: float, linear_input_bytes: float = ACT_BYTES) -> float:
    """What MLA saves besides Q, K and V, whole on every TP rank (its down-projections are
    duplicated, not split): each latent's RMSNorm input (16-bit) and the up-projection's input
    (``linear_input_bytes``), q_lora_rank + kv_lora_rank wide, and the shared rotary key,
    qk_rope_head_dim wide. Megatron-Core's ``MLASelfAttention`` up-projects to full per-head K and V
    before the fused attention, which saves those (the Q, K, V terms of
    ``activation_bytes_per_layer``). DeepSeek-V3 per token: (2 + 2) x 2048 + 2 x 64 = 8,320 bytes."""
    if not model.is_mla:
        return 0.0
    latents = model.q_lora_rank + model.kv_lora_rank
    return (ACT_BYTES + linear_input_bytes) * tokens * latents + ACT_BYTES * tokens * model.qk_rope_head_dim


def mtp_activation_bytes(
    model: ModelSpec,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    flash: bool,
    cp: int = 1,
    linear_input_bytes: float = ACT_BYTES,
    etp: int | None = None,
) -> float:
    """Bytes the MTP modules save for backward per micro-batch on the last stage: each module's
    layer (``activation_bytes_per_layer``), the two norm inputs and the projection's 2h-wide input.
    Its logits live one module at a time like the head's (``head_activation_bytes``)."""
    if not model.mtp_layers:
        return 0.0
    tokens = micro_batch * seq_len / cp
    layer = activation_bytes_per_layer(
        model, model.mtp_layer_kind, seq_len, micro_batch, tp, sequence_parallel, recompute, flash, cp,
        linear_input_bytes, etp,
    )  # fmt: skip
    # the two norms' inputs (embedding and hidden state, h each, 16-bit) and the projection's 2h input
    around = (ACT_BYTES + linear_input_bytes) * tokens * 2 * model.hidden_size / (tp if sequence_parallel else 1)
    return model.mtp_layers * (layer + around)


def in_flight_micro_batches(stage: int, pp: int, num_micro_batches: int, vpp: int) -> float:
    """Micro-batches' worth of this stage's activations held at the schedule's peak.

    1F1B: stage r holds pp - r micro-batches. Interleaved 1F1B (Megatron-Core ``schedules.py``):
    rank r runs 2 (pp - r - 1) + (vpp - 1) pp warm-up chunk forwards and holds one more, each
    chunk 1/vpp of the stage, which for the first stage is pp (1 + (pp - 1) / (pp vpp))
    (Korthikanti et al. eq. 5). With as many micro-batches as stages, every rank runs all its
    chunk forwards before any backward (``all_warmup_microbatches``) and holds all of them.

    >>> in_flight_micro_batches(0, 8, 64, 8), in_flight_micro_batches(7, 8, 64, 8)
    (8.875, 7.125)
    >>> in_flight_micro_batches(3, 4, 4, 2)  # not (0 + 4 + 1) / 2 = 2.5
    4.0
    """
    if vpp == 1:
        return float(min(pp - stage, num_micro_batches))
    if num_micro_batches == pp:
        return float(num_micro_batches)
    chunk_forwards = 2 * (pp - stage - 1) + (vpp - 1) * pp + 1
    return min(chunk_forwards / vpp, float(num_micro_batches))


def head_activation_bytes(
    model: ModelSpec, seq_len: int, micro_batch: int, tp: int, cp: int, fused_cross_entropy: bool = False
) -> float:
    """Last stage: final-norm input and the logits for the loss, one micro-batch at a time: 16-bit
    logits that a fused loss overwrites with their gradient, or fp32 softmax probabilities."""
    tokens = micro_batch * seq_len / cp
    per_logit = ACT_BYTES if fused_cross_entropy else 4.0
    return ACT_BYTES * tokens * model.hidden_size + per_logit * tokens * padded_vocab(model, tp) / tp
