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


@dataclass(frozen=True)
class StateBytes:
    """Per-GPU bytes of model state."""

    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def state_bytes(params: float, dtype: str, dp: int, distributed_optimizer: bool) -> StateBytes:
    """Weights, gradients and Adam state for ``params`` parameters held by one GPU."""
    grad = 2.0 if dtype == "fp16" else 4.0
    opt = 16.0 if dtype == "fp16" else 12.0
    shard = dp if distributed_optimizer else 1
    return StateBytes(weights=2.0 * params, grads=grad * params, optimizer=opt * params / shard)


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


def stage_params(model: ModelSpec, layers: range, tp: int, ep: int, first: bool, last: bool, pp: int) -> float:
    """Parameters one GPU of a pipeline stage holds. Norms, row-parallel biases and learned
    positions are replicated over TP; everything else is split tp ways (experts ep * tp ways)."""
    total = sum(
        n * layer_params_per_gpu(model, kind, tp, ep)
        for kind, n in model.kind_counts(layers.start, layers.stop).items()
    )
    total += embedding_params_per_gpu(model, tp) if first else 0.0
    return total + (head_params_per_gpu(model, tp, pp > 1) if last else 0.0)


def layer_params_per_gpu(model: ModelSpec, kind: LayerKind, tp: int, ep: int) -> float:
    """Parameters of one layer of ``kind`` on one GPU at TP degree ``tp`` (experts over ep * tp)."""
    whole = model.layer_tp_replicated_params(kind)
    experts = model.layer_expert_params(kind)
    return (model.layer_params(kind) - whole - experts) / tp + whole + experts / (tp * ep)


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
) -> float:
    """Bytes one layer stores for backward, for one micro-batch on one GPU.

    Tensors saved (Korthikanti Fig. 4 and 5), with T = b s / cp tokens, t = tp:
    replicated over TP unless sequence parallel: norm inputs 2 x 2Th, QKV and MLP inputs
    2 x 2Th, dropout masks 2 x Th; split over TP: Q, K, V, output-projection input, MLP
    activation input(s) and down-projection input; core attention (dropped by selective
    recompute): scores 2 a s T, dropout mask and output 3 a s T, or only the log-sum-exp of a
    flash kernel. Full recompute keeps only the layer input, 2Th (split under SP).
    """
    kind = layer if isinstance(layer, LayerKind) else model.layer_kind(layer)
    tokens = micro_batch * seq_len / cp
    h, d = model.hidden_size, model.head_dim
    rep_div = tp if sequence_parallel else 1
    if recompute == "full":
        return ACT_BYTES * tokens * h / rep_div
    drop = 1 if model.dropout else 0
    sublayers = kind.attention + (kind.moe or kind.ffn > 0)
    replicated = sublayers * (2 * ACT_BYTES + drop) * tokens * h
    heads, kv = model.num_heads // tp, kv_heads_per_rank(model, tp)
    split = 0.0
    if kind.attention:
        split += ACT_BYTES * tokens * (heads + 2 * kv) * d + ACT_BYTES * tokens * heads * d
    if kind.moe:
        routed = tokens * model.moe_top_k
        f = model.moe_ffn_hidden_size / tp
        split += ACT_BYTES * routed * h + (3 if model.gated_mlp else 2) * ACT_BYTES * routed * f
        if model.moe_shared_ffn_hidden_size:
            split += (3 if model.gated_mlp else 2) * ACT_BYTES * tokens * model.moe_shared_ffn_hidden_size / tp
    elif kind.ffn:
        split += (3 if model.gated_mlp else 2) * ACT_BYTES * tokens * kind.ffn / tp
    if not kind.attention:
        core = 0.0
    elif flash:
        core = 4.0 * tokens * heads  # fp32 log-sum-exp per query and head
    else:
        scores = micro_batch * heads * seq_len * seq_len / cp
        core = ACT_BYTES * scores + (3 * scores if drop else 0)
    if recompute == "selective":
        core = 0.0
    return replicated / rep_div + split + core


def in_flight_micro_batches(stage: int, pp: int, num_micro_batches: int, vpp: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at the 1F1B peak: pp - stage,
    times (1 + (pp-1)/(pp vpp)) for the first stage under interleaving (Korthikanti eq. 5)."""
    held = min(pp - stage, num_micro_batches)
    if vpp > 1:
        held *= 1 + (pp - 1) / (pp * vpp)
    return held


def head_activation_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, cp: int) -> float:
    """Last stage: final-norm input and fp32 logits for the loss, one micro-batch at a time."""
    tokens = micro_batch * seq_len / cp
    return ACT_BYTES * tokens * model.hidden_size + 4.0 * tokens * padded_vocab(model, tp) / tp
