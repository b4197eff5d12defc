"""GPU catalogue: peak dense tensor throughput, HBM, power. Every figure carries its source.

Peak FLOP/s are *dense* (no 2:4 sparsity) tensor-core rates as printed on NVIDIA datasheets,
which quote sparse rates with an asterisk; we halve those. Byte sizes are decimal (80 GB =
80e9 bytes) as datasheets print them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from topologies.naming import lookup


class GPUSpec(BaseModel):
    """One accelerator model, with the source of each figure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Catalogue name, e.g. 'H100-SXM'.")
    bf16_flops_per_s: float = Field(gt=0, description="Dense fp16/bf16 tensor-core peak, FLOP/s.")
    fp8_flops_per_s: float | None = Field(
        default=None, gt=0, description="Dense fp8 tensor-core peak, FLOP/s; None if unsupported."
    )
    hbm_bytes: float = Field(gt=0, description="HBM capacity in bytes.")
    hbm_bw_bytes_per_s: float = Field(gt=0, description="HBM bandwidth in bytes/s.")
    tdp_watts: float = Field(gt=0, description="Thermal design power (max board power), W.")
    sources: dict[str, str] = Field(description="Field name -> where the figure comes from.")

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak for a training dtype ('fp16', 'bf16' or 'fp8')."""
        if dtype == "fp8":
            if self.fp8_flops_per_s is None:
                raise ValueError(f"{self.name} has no fp8 tensor cores; use --dtype bf16 or fp16.")
            return self.fp8_flops_per_s
        return self.bf16_flops_per_s


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM4 80GB column"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM column; sparse rate / 2"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM column; sparse rate / 2"
_B200 = "NVIDIA HGX B200 specifications (2024), per-GPU figures; sparse rate / 2"
_GB200 = "NVIDIA GB200 NVL72 specifications (2024), individual Blackwell GPU; sparse rate / 2"

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec(
            name="A100-SXM4-80GB",
            bf16_flops_per_s=312e12,
            fp8_flops_per_s=None,
            hbm_bytes=80e9,
            hbm_bw_bytes_per_s=2.039e12,
            tdp_watts=400,
            sources={
                "bf16_flops_per_s": f"{_A100}: BF16/FP16 Tensor Core 312 TFLOPS (dense)",
                "fp8_flops_per_s": "Ampere has no FP8 tensor cores (A100 datasheet lists none)",
                "hbm_bytes": f"{_A100}: 80GB HBM2e",
                "hbm_bw_bytes_per_s": f"{_A100}: 2,039 GB/s",
                "tdp_watts": f"{_A100}: max TDP 400W",
            },
        ),
        GPUSpec(
            name="H100-SXM",
            bf16_flops_per_s=989.4e12,
            fp8_flops_per_s=1978.9e12,
            hbm_bytes=80e9,
            hbm_bw_bytes_per_s=3.35e12,
            tdp_watts=700,
            sources={
                "bf16_flops_per_s": f"{_H100}: BF16 1,979 TFLOPS sparse",
                "fp8_flops_per_s": f"{_H100}: FP8 3,958 TFLOPS sparse",
                "hbm_bytes": f"{_H100}: 80GB HBM3",
                "hbm_bw_bytes_per_s": f"{_H100}: 3.35 TB/s",
                "tdp_watts": f"{_H100}: up to 700W (configurable)",
            },
        ),
        GPUSpec(
            name="H200",
            bf16_flops_per_s=989.4e12,
            fp8_flops_per_s=1978.9e12,
            hbm_bytes=141e9,
            hbm_bw_bytes_per_s=4.8e12,
            tdp_watts=700,
            sources={
                "bf16_flops_per_s": f"{_H200}: BF16 1,979 TFLOPS sparse",
                "fp8_flops_per_s": f"{_H200}: FP8 3,958 TFLOPS sparse",
                "hbm_bytes": f"{_H200}: 141GB HBM3e",
                "hbm_bw_bytes_per_s": f"{_H200}: 4.8 TB/s",
                "tdp_watts": f"{_H200}: up to 700W (configurable)",
            },
        ),
        GPUSpec(
            name="B200",
            bf16_flops_per_s=2.25e15,
            fp8_flops_per_s=4.5e15,
            hbm_bytes=180e9,
            hbm_bw_bytes_per_s=7.7e12,
            tdp_watts=1000,
            sources={
                "bf16_flops_per_s": f"{_B200}: FP16/BF16 4.5 PFLOPS sparse",
                "fp8_flops_per_s": f"{_B200}: FP8/FP6 9 PFLOPS sparse",
                "hbm_bytes": f"{_B200}: 180GB HBM3e",
                "hbm_bw_bytes_per_s": f"{_B200}: 7.7 TB/s",
                "tdp_watts": f"{_B200}: configurable up to 1,000W",
            },
        ),
        GPUSpec(
            name="GB200",
            bf16_flops_per_s=2.5e15,
            fp8_flops_per_s=5e15,
            hbm_bytes=186e9,
            hbm_bw_bytes_per_s=8e12,
            tdp_watts=1200,
            sources={
                "bf16_flops_per_s": f"{_GB200}: FP16/BF16 5 PFLOPS sparse",
                "fp8_flops_per_s": f"{_GB200}: FP8/FP6 10 PFLOPS sparse",
                "hbm_bytes": f"{_GB200}: 186GB HBM3e",
                "hbm_bw_bytes_per_s": f"{_GB200}: 8 TB/s",
                "tdp_watts": f"{_GB200}: configurable up to 1,200W",
            },
        ),
    ]
}


def resolve_gpu(name: str) -> GPUSpec:
    """Look a GPU up by catalogue name (case-insensitive)."""
    return lookup(GPUS, name, "GPU", "")
