"""TrainingSpec: how the model is trained, independent of how it is laid out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TrainingSpec(BaseModel):
    """Sequence, batch, precision and optimizer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq_len: int = Field(default=8192, gt=0, description="Tokens per sequence s.")
    global_batch: int = Field(default=1024, gt=0, description="Sequences per optimizer step B.")
    dtype: Literal["fp16", "bf16", "fp8"] = Field(
        default="bf16", description="Compute precision; fp8 runs GEMMs in fp8 with bf16 weights."
    )
    optimizer: Literal["adam"] = Field(default="adam", description="Adam(W) with fp32 master weights.")
    distributed_optimizer: bool = Field(
        default=True, description="Layouts may shard optimizer state over DP (ZeRO-1, Megatron)."
    )
    flash_attention: bool = Field(
        default=True,
        description="Fused attention that never stores the s x s scores and skips masked blocks.",
    )

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
