"""TrainingSpec: how the model is trained, independent of how it is laid out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from topologies.bounds import Bound, bounds_validator
from topologies.errors import InputError

Dtype = Literal["fp16", "bf16", "fp8", "mxfp8", "nvfp4"]
# GEMMs in these, everything else in bf16: bytes per element, scales included (mxfp8: a scale byte
# per 32 values; nvfp4: half a byte per value and a scale byte per 16)
LOW_PRECISION_BYTES: dict[str, float] = {"fp8": 1.0, "mxfp8": 1.0 + 1 / 32, "nvfp4": 0.5 + 1 / 16}
LOW_PRECISION: tuple[str, ...] = tuple(LOW_PRECISION_BYTES)
MAX_GLOBAL_BATCH = 10**7
"""Most sequences per step: published runs step 1,000 to 16,000 sequences (about 16M tokens), so
ten million only refuses typos (10**30) and tokens given for sequences."""
_BOUNDS: dict[str, Bound] = {
    "seq_len": Bound(1, 10**9, "tokens", "the longest contexts trained are about 10**7 tokens"),
    "global_batch": Bound(1, MAX_GLOBAL_BATCH, "sequences", "published runs step 1,000 to 16,000 sequences"),
}


class TrainingSpec(BaseModel):
    """Sequence, batch, precision and optimizer."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    seq_len: int = Field(default=8192, gt=0, description="Tokens per sequence s.")
    global_batch: int = Field(default=1024, gt=0, description="Sequences per optimizer step B.")
    dtype: Dtype = Field(
        default="bf16",
        description="Number format of the GEMMs. fp8 (per-tensor scaling, Hopper and later), mxfp8 and nvfp4 "
        "(block scaling, Blackwell) run the three GEMMs of every linear layer in that format, as Transformer "
        "Engine does; attention, norms, activations, embedding, LM head and the optimizer stay in bf16.",
    )
    fp8_recipe: Literal["delayed", "current"] = Field(
        default="delayed",
        description="fp8 scaling: 'delayed' takes the scale from an amax history (one read per cast); "
        "'current' (tensorwise) measures the amax first (two reads per cast). Only used with dtype fp8.",
    )
    fp8_params: bool = Field(
        default=False,
        description="Low-precision formats: keep the model's weights in that format (Megatron's "
        "--fp8-param-gather; the fp32 master copy stays in the optimizer) and all-gather them in it.",
    )
    grad_reduce_in_fp32: bool | None = Field(
        default=None,
        description="Accumulate and reduce gradients in fp32 (4 bytes per parameter) or in 16 bits. None: fp32 "
        "for bf16 (Megatron-LM's default), 16 bits for fp16 (likewise) and for fp8, mxfp8 and nvfp4, whose "
        "recipes in NeMo and Megatron-Bridge all set grad_reduce_in_fp32=False.",
    )
    optimizer: Literal["adam"] = Field(default="adam", description="Adam(W) with fp32 master weights.")
    precision_aware_optimizer: bool = Field(
        default=False,
        description="Adam keeps only the 16-bit remainders of its fp32 master weights and reads 16-bit gradients "
        "directly: 10 bytes of state per parameter instead of 12, or 16 when gradients are 16-bit (Megatron's "
        "--use-precision-aware-optimizer with store_param_remainders; Apex's DistributedFusedAdam in NeMo 1).",
    )
    distributed_optimizer: bool = Field(
        default=True, description="Layouts may shard model state over DP (ZeRO-1 to ZeRO-3)."
    )
    fused_cross_entropy: bool = Field(
        default=True,
        description="The loss runs as one fused kernel over the 16-bit logits (Transformer Engine's, as NeMo and "
        "Megatron-Bridge use); False is Megatron-LM's unfused fp32 vocabulary-parallel cross entropy.",
    )
    rope_fusion: bool = Field(
        default=True,
        description="Rotary embeddings as one fused kernel (Megatron's apply_rope_fusion, Transformer Engine's "
        "fused RoPE); False runs Megatron-Core's unfused PyTorch rotation (flops.unfused_rotary), as YaRN models "
        "(GPT-OSS) do: Megatron-Bridge turns the fusion off for YaRN position embeddings.",
    )
    flash_attention: bool = Field(
        default=True,
        description="Fused attention that never stores the s x s scores and skips masked blocks.",
    )
    attention_kernel: Literal["cudnn", "flash2"] = Field(
        default="cudnn",
        description="Which fused attention runs: cuDNN's (Transformer Engine's default, FlashAttention-3 class on "
        "Hopper) or the FlashAttention-2 package (NeMo 1.x's NVTE_FUSED_ATTN=0), about half as fast on Hopper.",
    )
    fp8_attention: bool = Field(
        default=False,
        description="Fused attention in fp8 (Transformer Engine's fp8_dot_product_attention: cuDNN's fp8 flash "
        "attention): its two GEMMs at the fp8 tensor rate, the softmax's exponentials as before; needs an fp8 "
        "format (Megatron-Bridge's full-iteration mxfp8 recipes from 26.06 set it).",
    )
    moe_capacity_factor: float | None = Field(
        default=None,
        gt=0,
        le=64,
        description="MoE token dropping: each expert keeps at most this many times its balanced share of the "
        "routed tokens (Megatron's --moe-expert-capacity-factor); None = dropless.",
    )
    moe_pad_to_capacity: bool = Field(
        default=False,
        description="Pad every expert's input to its capacity (--moe-pad-expert-input-to-capacity): each runs "
        "exactly capacity rows, so no host sync on the row counts; needs moe_capacity_factor.",
    )
    moe_flex_backend: Literal["deepep", "hybridep"] | None = Field(
        default=None,
        description="The flex dispatcher's backend (Megatron's --moe-flex-dispatcher-backend): 'hybridep' "
        "permutes inside its dispatch and combine kernels (no separate permute and unpermute passes), 'deepep' "
        "dispatches in token order and Megatron permutes after it; None = the cluster's rule (HybridEP on a "
        "multi-host NVLink domain, else DeepEP: cost_models.moe.flex_backend).",
    )
    cuda_graphs: bool = Field(
        default=False,
        description="Full-iteration CUDA graphs (Megatron's cuda_graph_impl with scope full_iteration): a captured "
        "graph cannot stop for the host, so MoE layers run without host syncs (Megatron-Bridge pairs them with "
        "static expert buffers, moe_expert_rank_capacity_factor).",
    )

    _bounds = bounds_validator(_BOUNDS)

    @model_validator(mode="after")
    def _check(self) -> TrainingSpec:
        if self.fp8_params and not self.low_precision:
            raise InputError(
                f"low-precision primary weights (fp8_params) need an fp8 or fp4 format, not {self.dtype}; "
                "set fp8_params false or dtype to fp8, mxfp8 or nvfp4"
            )
        if self.fp8_attention and self.dtype not in ("fp8", "mxfp8"):
            raise InputError(
                f"fp8 attention (fp8_attention) runs in an fp8 format's recipe, not {self.dtype}; "
                "set fp8_attention false or dtype to fp8 or mxfp8"
            )
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            raise InputError(
                "moe_pad_to_capacity pads each expert to its capacity, which needs moe_capacity_factor; "
                "set a capacity factor (1.0 is Megatron-Bridge's token-drop recipe) or pad false"
            )
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def low_precision(self) -> bool:
        """GEMMs run in an 8- or 4-bit format."""
        return self.dtype in LOW_PRECISION

    @property
    def grad_bytes(self) -> float:
        """Bytes of one accumulated gradient (the buffer the DP reduction moves)."""
        fp32 = self.dtype == "bf16" if self.grad_reduce_in_fp32 is None else self.grad_reduce_in_fp32
        return 4.0 if fp32 else 2.0

    @property
    def param_bytes(self) -> float:
        """Bytes of one model weight as the layers read it: 16-bit, or with low-precision primary
        weights 1 (fp8), 1 + 1/32 (mxfp8: a scale byte per 32 values) or 0.5 + 1/16 (nvfp4)."""
        return LOW_PRECISION_BYTES[self.dtype] if self.fp8_params else 2.0
