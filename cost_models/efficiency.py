"""How close kernels and links get to their datasheet peaks: the cost model's only fitted part.

Each constant has a physical meaning. Three were fitted once, by a grid search, to Table A of
shared/reference/calibration.md (A100, 2021 Megatron): the A100's sustained GEMM fraction
(0.72), ``gemm_half_dim`` (64) and ``hbm_efficiency`` (0.8). A per-kernel launch overhead was
tried and the fit preferred zero, so it is not modelled. The other GPUs' GEMM fractions are not
fitted: each is its public cuBLAS large-GEMM fraction times the same training/cuBLAS ratio the
A100 shows (0.72 / 0.82 = 0.88). Table B (H100) is therefore a prediction, not a fit.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Efficiency(BaseModel):
    """Achievable fractions of peak, per kernel family and link."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gemm_max: dict[str, float] = Field(
        default={"A100-SXM4-80GB": 0.72, "H100-SXM": 0.65, "H200": 0.67, "B200": 0.63, "GB200": 0.63},
        description="Fraction of dense peak large GEMMs sustain inside training, per GPU. A100: fitted "
        "to table A. Others: public cuBLAS large-GEMM fraction (H100 SXM ~0.74, H200 ~0.76, B200/GB200 "
        "~0.72) x 0.88, the A100's training/cuBLAS ratio.",
    )
    gemm_half_dim: float = Field(
        default=64.0,
        description="A GEMM dimension of this size runs at half speed along that dimension: each of "
        "m, n, k contributes a factor d / (d + gemm_half_dim) (tile and wave quantisation).",
    )
    flash_efficiency: float = Field(
        default=0.55, description="Fraction of peak of fused (flash) attention, forward and backward."
    )
    hbm_efficiency: float = Field(
        default=0.8, description="Fraction of HBM bandwidth memory-bound kernels (norms, softmax) reach."
    )
    nvlink_efficiency: float = Field(
        default=0.8, description="NCCL bus bandwidth over NVLink / one-way link rate (nccl-tests on DGX)."
    )
    scaleout_efficiency: float = Field(default=0.9, description="NCCL bus bandwidth over InfiniBand / NIC line rate.")
    tp_overlap_hidden: float = Field(
        default=0.7, description="Fraction of TP communication hidden behind GEMMs when overlap is on."
    )
    step_overhead_s: float = Field(
        default=0.0, description="Fixed per-step time (data loading, logging, launch), seconds."
    )

    def gemm_peak_fraction(self, gpu: str) -> float:
        return self.gemm_max.get(gpu, 0.63)

    def shape_factor(self, m: int, n: int, k: int) -> float:
        """Product of d / (d + half) over the three GEMM dimensions (1 for huge GEMMs)."""
        half = self.gemm_half_dim
        return (m / (m + half)) * (n / (n + half)) * (k / (k + half))


DEFAULT_EFFICIENCY = Efficiency()
