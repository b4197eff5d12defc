"""torchtitan's runtime (``Efficiency.runtime = "torchtitan"``): where a step of torchtitan (FSDP2,
TP with sequence parallelism and optional async TP, pipelining, context parallelism through
PyTorch's ring attention, float8 through torchao, torch.compile) costs what Megatron's does not.

Every term is a small function of times and sizes the rest of the cost model already computes,
pinned by tests/cost_models/test_titan.py to hand-computed numbers:

- ``fsdp2_exposed_s``: FSDP2 gathers each transformer block's parameters before its forward
  (and, resharded after forward, again before its backward), prefetching one block ahead, and
  reduce-scatters each block's gradients after its backward. Exposed: the first gather, any
  block whose compute is shorter than its traffic, the last reduce-scatter; the root unit
  (embedding, final norm, LM head) is gathered before the first block and reduced after the last,
  both exposed.
- ``ring_cp_exposed_s``: PyTorch's context-parallel SDPA with torchtitan's default
  ``context_parallel_rotate_method = "allgather"``: keys and values all-gathered over the cp group
  while the first (local, load-balanced causal) chunk computes, again in backward, and the key /
  value gradients (fp32 accumulators) passed round the ring beside each chunk's backward.
- ``op_sac_recompute_s``: torchtitan's per-op selective AC saves the attention kernel's output and
  every other matmul's; it recomputes the rest of the layer's forward: the key projection, the
  output projection, one of the two MLP up-projections, and the elementwise ops.
- float8 through torchao: tensorwise scaling is Transformer Engine's current scaling (its casts
  are the cost model's); rowwise runs its GEMMs at ``rowwise_gemm_fraction`` of tensorwise's rate.
- Without torch.compile every elementwise op is its own kernel chain: memory-bound passes cost
  ``eager_memory_factor`` times the fused ones.

Memory (``titan_step.stage_memory``): FSDP2 keeps fp32 sharded parameters, fp32 sharded gradients
and the two fp32 Adam moments (16 bytes per parameter over the shard group); its buffers hold two
blocks' gathered bf16 parameters (the one computing and the one prefetched) and one block's
unsharded bf16 gradients with their fp32 copy for the reduce-scatter, and the root unit's gathered
parameters. With pipelining every block of the stage stays gathered and, gradient sync being off
until the last micro-batch, FSDP2 accumulates each unsharded gradient in the reduce dtype
(``pp_fsdp2_buffer_bytes``). Activations are torchtitan's (per-op SAC keeps the saved outputs
above and SDPA's logsumexp, full AC each block's input); a context-parallel layer holds the keys and
values of every chunk and its fp32 gradient accumulators while it runs (``ring_cp_buffer_bytes``);
the loss holds its logits at the bytes per entry of ``loss_logit_bytes``; and the caching allocator
reserves ``allocator_reserve_fraction`` more than it hands out (torch.cuda.max_memory_reserved is
what torchtitan logs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ACT_BYTES = 2.0  # bf16 activations
FSDP2_STATE_BYTES_PER_PARAM = 16.0  # fp32 sharded parameter, fp32 sharded gradient, Adam's m and v in fp32
ACCUMULATED_GRAD_BYTES = 4.0  # FSDP2's unsharded gradient accumulator, in the reduce dtype (fp32)
LSE_BYTES = 4.0  # SDPA's logsumexp, fp32 per query token and head
# Bytes per logit entry at the loss's peak (torchtitan's cross_entropy_loss on pred.float()):
# eager aten: the bf16 logits the train step still holds, their fp32 upcast, the fp32 log-softmax
# output (its kernel fuses max, exp, sum and log);
EAGER_LOGIT_BYTES = 10.0
# loss parallel (tp > 1): DTensor's log-softmax is decomposed (torch/distributed/tensor/parallel/
# loss.py ``_log_softmax``): the fp32 input, ``shifted = x - max`` and ``exp(shifted)`` are alive
# together beside the bf16 logits, then the result replaces the exponentials: 2 + 4 + 4 + 4;
LOSS_PARALLEL_LOGIT_BYTES = 14.0
# compiled (torch.compile on the loss): inductor fuses the upcast, log-softmax and their backward,
# saving the bf16 logits and a per-token statistic; the gradient comes out in bf16: 2 + 2.
COMPILED_LOGIT_BYTES = 4.0


class TitanSettings(BaseModel):
    """The torchtitan job settings that change its costs and no spec carries, and the constants
    of its runtime fitted to table H (``cost_models.published_titan``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compile: bool = Field(default=True, description="torch.compile on the model's blocks (``compile.enable``).")
    float8_scaling: Literal["tensorwise", "rowwise"] = Field(
        default="rowwise",
        description="torchao float8 recipe when the training format is fp8 ('rowwise' is what the torchtitan "
        "export writes; 'tensorwise' is torchao's default dynamic per-tensor scaling).",
    )
    fsdp_float8_all_gather: bool = Field(
        default=False, description="FSDP2 all-gathers float8 weights (``enable_fsdp_float8_all_gather``)."
    )
    eager_memory_factor: float = Field(
        default=2.0,
        ge=1,
        description="Cost of the memory-bound ops without torch.compile over their fused cost (eager RMSNorm, "
        "rotary, SiLU-and-multiply and casts run as chains of separate kernels). Fitted to table H's two "
        "eager / compiled pairs (T1, T3).",
    )
    rowwise_gemm_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Rate of torchao's rowwise-scaled float8 GEMMs over tensorwise's (June 2025: the source "
        "notes a slow rowwise baseline, torchtitan issue 1207). Fitted to table H's four rowwise runs.",
    )
    attention_factor: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Rate of PyTorch's SDPA (flash backend) inside torchtitan over the fused-attention fraction "
        "of its kernel (Efficiency.flash_efficiency): fitted to table H's long-sequence runs.",
    )
    compile_loss: bool = Field(
        default=True,
        description="torch.compile also covers the loss when ``compile`` is on: torchtitan compiles it with the "
        "model from 2025 on (``build_cross_entropy_loss``; ``compile.components`` later); its December 2024 "
        "train.py left it eager (a TODO: 'compiling loss function causes CUDA errors').",
    )
    allocator_reserve_fraction: float = Field(
        default=0.15,
        ge=0,
        description="Bytes the caching allocator reserves beyond those allocated at the peak (fragmentation "
        "across block sizes; torchtitan logs max_memory_reserved). Fitted to table H's memory column.",
    )


def fsdp2_exposed_s(
    gather_s: float, reduce_s: float, fwd_s: float, bwd_s: float, blocks: int, reshard: bool
) -> tuple[float, float]:
    """(forward, backward) FSDP2 time on the critical path of one pass over ``blocks`` equal
    blocks, each gathering in ``gather_s``, reduce-scattering in ``reduce_s`` and computing in
    ``fwd_s`` / ``bwd_s``, with one block prefetched.

    Forward: the first gather waits, each later one hides behind the previous block's forward.
    Backward: the last block's parameters stay gathered from its forward (torchtitan does not
    reshard it); each other block's regather (``reshard``) and the previous block's
    reduce-scatter share the link behind one block's backward; the last reduce-scatter waits.

    >>> fsdp2_exposed_s(1.0, 2.0, 3.0, 4.0, 5, True)
    (1.0, 2.0)
    """
    if blocks <= 0:
        return 0.0, 0.0
    fwd = gather_s + (blocks - 1) * max(0.0, gather_s - fwd_s)
    per_block = (gather_s if reshard else 0.0) + reduce_s
    bwd = (blocks - 1) * max(0.0, per_block - bwd_s) + reduce_s
    return fwd, bwd


def ring_cp_exposed_s(
    kv_gather_s: float, dkv_send_s: float, attn_fwd_s: float, attn_bwd_s: float, cp: int
) -> tuple[float, float]:
    """(forward, backward) context-parallel communication exposed per attention layer.

    ``kv_gather_s``: all-gathering every rank's keys and values; ``dkv_send_s``: one ring step of
    this rank's key and value gradients (fp32); ``attn_*_s``: the layer's whole attention kernel
    time on this rank, of which each of the cp chunks is 1/cp (load balancing makes the chunks
    equal). Forward, the gather hides behind the local chunk; backward, it is gathered again
    behind the local chunk's backward, and cp - 1 gradient sends each hide behind one chunk, the
    last one (home to the owner) behind none.

    >>> ring_cp_exposed_s(3.0, 1.0, 4.0, 8.0, 4)
    (2.0, 2.0)
    """
    if cp <= 1:
        return 0.0, 0.0
    fwd = max(0.0, kv_gather_s - attn_fwd_s / cp)
    bwd = max(0.0, kv_gather_s - attn_bwd_s / cp) + (cp - 1) * max(0.0, dkv_send_s - attn_bwd_s / cp) + dkv_send_s
    return fwd, bwd


def op_sac_recompute_s(op_fwd_s: dict[str, float], kv_share: float) -> float:
    """Recompute of one layer under torchtitan's per-op SAC, from each op's forward seconds by
    name (``cost_models.flops`` names): the key projection's ``kv_share`` of the fused QKV GEMM
    (the second matmul of wq, wk, wv), the output projection (the fourth), half the fused MLP
    up-projection (w3, the sixth) and every memory-bound op (norms, rotary, activation, residuals).
    Attention is saved, not recomputed.

    >>> op_sac_recompute_s({"qkv": 6.0, "out-proj": 2.0, "mlp-up": 8.0, "mlp-down": 4.0, "norms": 1.0}, 1 / 6)
    8.0
    """
    gemms = {"qkv": kv_share, "out-proj": 1.0, "mlp-up": 0.5}
    saved = {"mlp-down", "attention-core", "attention-scores", "attention-values"}
    total = 0.0
    for name, seconds in op_fwd_s.items():
        if name in gemms:
            total += gemms[name] * seconds
        elif name not in saved:
            total += seconds
    return total


def op_sac_activation_bytes(tokens: float, hidden: int, q_width: int, kv_width: int, ffn: int, tp: int) -> float:
    """Bytes one layer saves for backward under per-op SAC, per micro-batch: the block's input
    (sequence-sharded over tp), the query and value projections' outputs, the attention output,
    the gate projection's output (column-parallel, / tp) and the down projection's output (row
    parallel: the whole sequence before its reduce-scatter), all bf16.

    >>> op_sac_activation_bytes(10, 8, 8, 2, 16, 1)
    1000.0
    """
    sharded = hidden / tp + (2 * q_width + kv_width + ffn) / tp
    return ACT_BYTES * tokens * (sharded + hidden)


def full_ac_activation_bytes(tokens: float, hidden: int, tp: int) -> float:
    """Bytes one layer saves under full AC: its bf16 input, sequence-sharded over tp.

    >>> full_ac_activation_bytes(10, 8, 2)
    80.0
    """
    return ACT_BYTES * tokens * hidden / tp


def op_sac_lse_bytes(tokens: float, heads: int, tp: int) -> float:
    """SDPA's fp32 logsumexp, which the flash backend saves for its backward beside the output
    (per-op SAC saves the attention op's outputs), per layer and micro-batch.

    >>> op_sac_lse_bytes(10, 8, 2)
    160.0
    """
    return LSE_BYTES * tokens * heads / tp


def loss_logit_bytes(tp: int, compiled: bool) -> float:
    """Bytes per logit entry (token x vocabulary shard) at the loss's peak: ``COMPILED_LOGIT_BYTES``
    when torch.compile fuses the loss, else ``LOSS_PARALLEL_LOGIT_BYTES`` under TP (torchtitan's
    loss parallel), else ``EAGER_LOGIT_BYTES``.

    >>> loss_logit_bytes(1, False), loss_logit_bytes(8, False), loss_logit_bytes(8, True)
    (10.0, 14.0, 4.0)
    """
    if compiled:
        return COMPILED_LOGIT_BYTES
    return LOSS_PARALLEL_LOGIT_BYTES if tp > 1 else EAGER_LOGIT_BYTES


def ring_cp_buffer_bytes(local_tokens: float, width: float, cp: int) -> float:
    """Bytes a context-parallel attention layer holds while its backward runs (PyTorch's
    ``_templated_ring_attention_backward`` with torchtitan's allgather rotation), per micro-batch:
    the keys and values of all cp chunks, all-gathered in bf16 (torchtitan repeats the KV heads
    before SDPA, so ``width`` is the query heads' width on this rank), and, for this rank's chunk,
    fp32 accumulators of the query gradient and of the key and value gradients, the latter double
    buffered as they travel round the ring (5 fp32 tensors of the chunk). The forward's gathered
    keys and values and fp32 output accumulator are a subset; without CP, none of it.

    >>> ring_cp_buffer_bytes(10, 4, 2)
    1120.0
    """
    if cp <= 1:
        return 0.0
    return local_tokens * width * (2 * ACT_BYTES * cp + 5 * 4.0)


def pp_fsdp2_buffer_bytes(gathered_bytes: float, gathered_params: float) -> float:
    """FSDP2's buffers with pipelining: every block of the stage stays gathered
    (``reshard_after_forward`` off; ``gathered_bytes``: their bytes as gathered) and, gradient sync
    being off until the last micro-batch (torch.distributed.pipelining's
    ``backward_maybe_with_nosync`` calls ``set_requires_gradient_sync(False)`` on an FSDP stage),
    FSDP2 accumulates each unsharded gradient in the reduce dtype
    (``FSDPParam.to_accumulated_grad_if_needed``: fp32 when the gradient is bf16).

    >>> pp_fsdp2_buffer_bytes(200.0, 100.0)
    600.0
    """
    return gathered_bytes + ACCUMULATED_GRAD_BYTES * gathered_params


def kept_fsdp2_buffer_bytes(gathered_bytes: float, block_params: float, root_params: float) -> float:
    """FSDP2's buffers without pipelining when it does not reshard after forward
    (``fsdp_reshard_after_forward = 'never'``): at the start of backward every block's parameters
    are still gathered (``gathered_bytes``), and the first block to run backward adds its bf16
    gradients and their fp32 copy for the reduce-scatter (6 bytes); the root unit stays gathered
    in bf16.

    >>> kept_fsdp2_buffer_bytes(3200.0, 100.0, 10.0)
    3820.0
    """
    return gathered_bytes + block_params * 6.0 + root_params * 2.0


def fsdp2_buffer_bytes(block_params: float, root_params: float, gather_bytes: float) -> float:
    """FSDP2's unsharded buffers at the peak: two blocks' gathered parameters (``gather_bytes``
    each: 2 in bf16, 1 in float8), one block's unsharded bf16 gradients and their fp32 copy
    for the reduce-scatter (6 bytes), and the root unit's gathered bf16 parameters.

    >>> fsdp2_buffer_bytes(10.0, 100.0, 2.0)
    300.0
    """
    return block_params * (2 * gather_bytes + 6.0) + root_params * 2.0


def reserved_bytes(allocated: float, fraction: float) -> float:
    """The caching allocator's reserve above ``allocated`` bytes at the peak.

    >>> reserved_bytes(100.0, 0.1)
    10.0
    """
    return allocated * fraction
