"""GPU catalogue: peak dense tensor throughput, SMs, HBM, power. Every figure carries its source.

Peak FLOP/s are *dense* (no 2:4 sparsity) tensor-core rates as printed on NVIDIA datasheets,
which quote sparse rates with an asterisk; we halve those. Bandwidths are decimal (3.35 TB/s =
3.35e12 bytes/s). HBM capacities are binary: HBM is built from stacks of 2^k GiB (an H100's
"80GB" is five 16 GiB stacks, 80 GiB = 85.9e9 bytes; CUDA reports about 79.2 GiB of it free
to allocate, PyTorch's out-of-memory message reads "total capacity of 79.1x GiB"), so the
datasheet figure is taken in GiB and the runtime's own share is reserved by the cost model.

Training number formats and the tensor cores that run them (``FORMATS``): fp16/bf16 everywhere;
``fp8`` with one scale per tensor (Transformer Engine's delayed or current scaling) from Hopper
on; the block-scaled formats ``mxfp8`` (one scale per 32 values) and ``nvfp4`` (one per 16) only
on Blackwell, whose tensor cores apply the scales.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from topologies.bounds import Bound, bounds_validator
from topologies.errors import InputError
from topologies.naming import lookup

Architecture = Literal["ampere", "hopper", "blackwell", "cpu"]
"""``cpu``: a host whose cores stand in for GPUs in a local cluster that ``ntp profile`` measured
(its 'bf16' peak is the GEMM rate it measured in the run's own format)."""

# format -> (architectures whose tensor cores run it, GPUSpec field with its peak)
FORMATS: dict[str, tuple[tuple[str, ...], str]] = {
    "fp16": (("ampere", "hopper", "blackwell", "cpu"), "bf16_flops_per_s"),
    "bf16": (("ampere", "hopper", "blackwell", "cpu"), "bf16_flops_per_s"),
    "fp8": (("hopper", "blackwell"), "fp8_flops_per_s"),
    "mxfp8": (("blackwell",), "fp8_flops_per_s"),
    "nvfp4": (("blackwell",), "fp4_flops_per_s"),
}


# Wide ranges: they catch typos and wrong units, never a real accelerator.
_BOUNDS: dict[str, Bound] = {
    "sm_count": Bound(1, 10_000, "SMs", "the largest GPUs have 148 (B200)"),
    "bf16_flops_per_s": Bound(
        1e8, 1e18, "FLOP/s", "today's GPUs run 3e14 (A100) to 2.5e15 (GB200), one CPU core 1e9 to 1e11"
    ),
    "fp8_flops_per_s": Bound(1e12, 1e18, "FLOP/s", "today's GPUs run 2e15 (H100) to 5e15 (GB200)"),
    "fp4_flops_per_s": Bound(1e12, 1e18, "FLOP/s", "today's GPUs run 9e15 (B200) to 1.5e16 (GB300)"),
    "hbm_bytes": Bound(2**30, 2**50, "bytes", "GPUs hold 80 GiB (8.6e10 bytes) to 288 GiB (B300)"),
    "hbm_bw_bytes_per_s": Bound(1e8, 1e15, "bytes/s", "HBM moves 2e12 (A100) to 8e12 (GB200), a CPU core 1e9 to 5e10"),
    "tdp_watts": Bound(1, 100_000, "W", "GPUs draw 400 W (A100) to 1,400 W (GB300)"),
}


class GPUSpec(BaseModel):
    """One accelerator model, with the source of each figure."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=100, description="Catalogue name, e.g. 'H100-SXM'.")
    architecture: Architecture = Field(description="Tensor-core generation; decides the number formats.")
    sm_count: int = Field(gt=0, description="Streaming multiprocessors (GEMM tiles run one per SM at a time).")
    bf16_flops_per_s: float = Field(gt=0, description="Dense fp16/bf16 tensor-core peak, FLOP/s.")
    fp8_flops_per_s: float | None = Field(
        default=None, gt=0, description="Dense fp8 tensor-core peak, FLOP/s; None if unsupported."
    )
    fp4_flops_per_s: float | None = Field(
        default=None, gt=0, description="Dense fp4 tensor-core peak, FLOP/s; None if unsupported."
    )
    hbm_bytes: float = Field(gt=0, description="HBM capacity in bytes (the datasheet's GB are GiB).")
    hbm_bw_bytes_per_s: float = Field(gt=0, description="HBM bandwidth in bytes/s.")
    tdp_watts: float = Field(gt=0, description="Thermal design power (max board power), W.")
    peak_basis_watts: float | None = Field(
        default=None,
        gt=0,
        description="Board power, W, of the part whose bf16 / fp8 datasheet peaks this GPU repeats while drawing "
        "tdp_watts (Blackwell Ultra repeats Blackwell's at 100-200 W more: Efficiency.power_headroom); None: the "
        "peaks are its own.",
    )
    sources: dict[str, str] = Field(description="Field name -> where the figure comes from.")

    _bounds = bounds_validator(_BOUNDS)

    def supports(self, dtype: str) -> bool:
        return self.architecture in FORMATS[dtype][0] and getattr(self, FORMATS[dtype][1]) is not None

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense tensor-core peak for a training format (``FORMATS``): the rate its GEMMs run at.

        >>> GPUS["B200"].peak_flops_per_s("nvfp4") / GPUS["B200"].peak_flops_per_s("bf16")
        4.0
        """
        if dtype not in FORMATS:
            raise InputError(f"unknown number format {dtype!r}; use one of {', '.join(FORMATS)}.")
        if not self.supports(dtype):
            runs = [f for f in FORMATS if self.supports(f)]
            raise InputError(
                f"{self.name} ({self.architecture}) has no {dtype} tensor cores; it runs {', '.join(runs)}: "
                "choose a format this GPU runs."
            )
        return getattr(self, FORMATS[dtype][1])


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM4 80GB column"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM column; sparse rate / 2"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM column; sparse rate / 2"
_B200 = "NVIDIA HGX B200 specifications (2024), per-GPU figures; sparse rate / 2"
_GB200 = "NVIDIA GB200 NVL72 specifications (2024), individual Blackwell GPU; sparse rate / 2"
_B300 = "NVIDIA HGX B300 specifications (2025), 8-GPU figures / 8; sparse rate / 2 unless stated dense"
_GB300 = "NVIDIA GB300 NVL72 specifications (2025), 72-GPU rack figures / 72; sparse rate / 2 unless stated dense"
_ULTRA = "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra' (2025)"
GIB = 2**30
_BINARY = "read as GiB (HBM stacks are binary)"
_OWN_PEAKS = "None: its datasheet peaks are its own, quoted at its own board power"
_SM_A100 = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): A100 has 108 SMs"
_SM_H100 = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): H100 SXM5 has 132 SMs"
_SM_B200 = "Chips and Cheese, 'Nvidia's B200: Keeping the CUDA Juggernaut Rolling' (2025): 74 SMs per die, 148 per GPU"
_SM_B300 = (
    f"{_ULTRA}: 160 SMs on the full two-die chip; assumed 148 enabled as on the B200, whose full chip also has 160"
)

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec(
            name="A100-SXM4-80GB",
            architecture="ampere",
            sm_count=108,
            bf16_flops_per_s=312e12,
            fp8_flops_per_s=None,
            hbm_bytes=80 * GIB,
            hbm_bw_bytes_per_s=2.039e12,
            tdp_watts=400,
            sources={
                "bf16_flops_per_s": f"{_A100}: BF16/FP16 Tensor Core 312 TFLOPS (dense)",
                "fp8_flops_per_s": "Ampere has no FP8 tensor cores (A100 datasheet lists none)",
                "fp4_flops_per_s": "Ampere has no FP4 tensor cores",
                "sm_count": _SM_A100,
                "architecture": _SM_A100,
                "hbm_bytes": f"{_A100}: 80GB HBM2e, {_BINARY}",
                "hbm_bw_bytes_per_s": f"{_A100}: 2,039 GB/s",
                "tdp_watts": f"{_A100}: max TDP 400W",
                "peak_basis_watts": _OWN_PEAKS,
            },
        ),
        GPUSpec(
            name="H100-SXM",
            architecture="hopper",
            sm_count=132,
            bf16_flops_per_s=989.4e12,
            fp8_flops_per_s=1978.9e12,
            hbm_bytes=80 * GIB,
            hbm_bw_bytes_per_s=3.35e12,
            tdp_watts=700,
            sources={
                "bf16_flops_per_s": f"{_H100}: BF16 1,979 TFLOPS sparse",
                "fp8_flops_per_s": f"{_H100}: FP8 3,958 TFLOPS sparse",
                "fp4_flops_per_s": f"{_H100}: no FP4 row (FP4 tensor cores arrive with Blackwell)",
                "sm_count": _SM_H100,
                "architecture": _SM_H100,
                "hbm_bytes": f"{_H100}: 80GB HBM3, {_BINARY}",
                "hbm_bw_bytes_per_s": f"{_H100}: 3.35 TB/s",
                "tdp_watts": f"{_H100}: up to 700W (configurable)",
                "peak_basis_watts": _OWN_PEAKS,
            },
        ),
        GPUSpec(
            name="H200",
            architecture="hopper",
            sm_count=132,
            bf16_flops_per_s=989.4e12,
            fp8_flops_per_s=1978.9e12,
            hbm_bytes=141 * GIB,
            hbm_bw_bytes_per_s=4.8e12,
            tdp_watts=700,
            sources={
                "bf16_flops_per_s": f"{_H200}: BF16 1,979 TFLOPS sparse",
                "fp8_flops_per_s": f"{_H200}: FP8 3,958 TFLOPS sparse",
                "fp4_flops_per_s": f"{_H200}: no FP4 row (FP4 tensor cores arrive with Blackwell)",
                "sm_count": f"{_SM_H100}; the H200 is the same GH100 configuration with HBM3e (H200 datasheet)",
                "architecture": f"{_H200}: NVIDIA Hopper architecture",
                "hbm_bytes": f"{_H200}: 141GB HBM3e, {_BINARY}",
                "hbm_bw_bytes_per_s": f"{_H200}: 4.8 TB/s",
                "tdp_watts": f"{_H200}: up to 700W (configurable)",
                "peak_basis_watts": _OWN_PEAKS,
            },
        ),
        GPUSpec(
            name="B200",
            architecture="blackwell",
            sm_count=148,
            bf16_flops_per_s=2.25e15,
            fp8_flops_per_s=4.5e15,
            fp4_flops_per_s=9e15,
            hbm_bytes=180 * GIB,
            hbm_bw_bytes_per_s=7.7e12,
            tdp_watts=1000,
            sources={
                "bf16_flops_per_s": f"{_B200}: FP16/BF16 4.5 PFLOPS sparse",
                "fp8_flops_per_s": f"{_B200}: FP8/FP6 9 PFLOPS sparse",
                "fp4_flops_per_s": f"{_B200}: FP4 18 PFLOPS sparse",
                "sm_count": _SM_B200,
                "architecture": f"{_B200}: NVIDIA Blackwell architecture",
                "hbm_bytes": f"{_B200}: 180GB HBM3e, {_BINARY}",
                "hbm_bw_bytes_per_s": f"{_B200}: 7.7 TB/s",
                "tdp_watts": f"{_B200}: configurable up to 1,000W",
                "peak_basis_watts": _OWN_PEAKS,
            },
        ),
        GPUSpec(
            name="GB200",
            architecture="blackwell",
            sm_count=148,
            bf16_flops_per_s=2.5e15,
            fp8_flops_per_s=5e15,
            fp4_flops_per_s=10e15,
            hbm_bytes=186 * GIB,
            hbm_bw_bytes_per_s=8e12,
            tdp_watts=1200,
            sources={
                "bf16_flops_per_s": f"{_GB200}: FP16/BF16 5 PFLOPS sparse",
                "fp8_flops_per_s": f"{_GB200}: FP8/FP6 10 PFLOPS sparse",
                "fp4_flops_per_s": f"{_GB200}: FP4 20 PFLOPS sparse",
                "sm_count": f"{_SM_B200}; assumed the same for the GB200's GPU (its higher peak comes from power)",
                "architecture": f"{_GB200}: NVIDIA Blackwell architecture",
                "hbm_bytes": f"{_GB200}: 186GB HBM3e, {_BINARY}",
                "hbm_bw_bytes_per_s": f"{_GB200}: 8 TB/s",
                "tdp_watts": f"{_GB200}: configurable up to 1,200W",
                "peak_basis_watts": _OWN_PEAKS,
            },
        ),
        GPUSpec(
            name="B300",
            architecture="blackwell",
            sm_count=148,
            bf16_flops_per_s=2.25e15,
            fp8_flops_per_s=4.5e15,
            fp4_flops_per_s=13.5e15,
            hbm_bytes=288 * GIB,
            hbm_bw_bytes_per_s=8e12,
            tdp_watts=1100,
            peak_basis_watts=1000,
            sources={
                "bf16_flops_per_s": f"{_B300}: FP16/BF16 36 PFLOPS sparse per 8 GPUs",
                "fp8_flops_per_s": f"{_B300}: FP8/FP6 72 PFLOPS sparse per 8 GPUs",
                "fp4_flops_per_s": f"{_B300}: FP4 108 PFLOPS dense (144 sparse) per 8 GPUs",
                "sm_count": _SM_B300,
                "architecture": f"{_ULTRA}: Blackwell Ultra, the same Blackwell architecture with faster NVFP4",
                "hbm_bytes": f"{_ULTRA}: 288GB HBM3e per GPU, {_BINARY}",
                "hbm_bw_bytes_per_s": f"{_ULTRA}: 8 TB/s HBM3e per GPU",
                "tdp_watts": "NVIDIA DGX B300 / HGX B300 system guides (2025): 1,100 W per B300 GPU",
                "peak_basis_watts": f"{_B300}: its FP16/BF16 and FP8 rates are the HGX B200's, {_B200} configurable up "
                "to 1,000W",
            },
        ),
        GPUSpec(
            name="GB300",
            architecture="blackwell",
            sm_count=148,
            bf16_flops_per_s=2.5e15,
            fp8_flops_per_s=5e15,
            fp4_flops_per_s=15e15,
            hbm_bytes=288 * GIB,
            hbm_bw_bytes_per_s=8e12,
            tdp_watts=1400,
            peak_basis_watts=1200,
            sources={
                "bf16_flops_per_s": f"{_GB300}: FP16/BF16 360 PFLOPS sparse per 72 GPUs",
                "fp8_flops_per_s": f"{_GB300}: FP8/FP6 720 PFLOPS sparse per 72 GPUs",
                "fp4_flops_per_s": f"{_GB300}: FP4 1,080 PFLOPS dense (1,440 sparse) per 72 GPUs; {_ULTRA}: 15 PFLOPS "
                "dense NVFP4 per GPU",
                "sm_count": _SM_B300,
                "architecture": f"{_ULTRA}: Blackwell Ultra, the same Blackwell architecture with faster NVFP4",
                "hbm_bytes": f"{_GB300}: up to 21 TB HBM3e per 72 GPUs; {_ULTRA}: 288GB per GPU, {_BINARY}",
                "hbm_bw_bytes_per_s": f"{_GB300}: up to 576 TB/s per 72 GPUs (8 TB/s per GPU)",
                "tdp_watts": f"{_ULTRA}: GB300 up to 1,400 W per GPU",
                "peak_basis_watts": f"{_GB300}: its FP16/BF16 and FP8 rates are the GB200 NVL72's, {_GB200} "
                "configurable up to 1,200W",
            },
        ),
    ]
}


def resolve_gpu(name: str) -> GPUSpec:
    """Look a GPU up by catalogue name (case-insensitive)."""
    return lookup(GPUS, name, "GPU", "")
