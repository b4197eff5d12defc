"""What a GPU-hour costs, per GPU type: public on-demand list prices, each with its source.

A price is for one GPU for one hour, with its share of the host (CPUs, memory, NICs) as the
provider bills it: an 8-GPU instance's hourly price divided by 8, a GB200 NVL72 4-GPU tray's
by 4. One provider for every type, so the types compare on the same footing; a GPU type with no
figure here has no default and the capacity planner asks for one (``--gpu-hour-cost``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_COREWEAVE = "CoreWeave GPU cloud pricing (coreweave.com/pricing), on-demand list price as of February 2026"


MAX_USD_PER_GPU_HOUR = 10_000.0  # a thousand times what a GPU hour rents for


class GpuHourPrice(BaseModel):
    """The price of one GPU-hour and where it comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    usd_per_gpu_hour: float = Field(gt=0, le=MAX_USD_PER_GPU_HOUR, description="US dollars for one GPU for one hour.")
    source: str = Field(min_length=1, description="Where the figure comes from, with the instance it divides.")


def _per_gpu(instance_usd_per_hour: float, gpus: int, instance: str) -> GpuHourPrice:
    return GpuHourPrice(
        usd_per_gpu_hour=instance_usd_per_hour / gpus,
        source=f"{_COREWEAVE}: {instance} ${instance_usd_per_hour:.2f}/h for {gpus} GPUs",
    )


# GPU catalogue name (topologies.gpus) -> price
GPU_HOUR_PRICES: dict[str, GpuHourPrice] = {
    "A100-SXM4-80GB": _per_gpu(21.60, 8, "NVIDIA A100 80GB, 8x GPU"),
    "H100-SXM": _per_gpu(49.24, 8, "NVIDIA HGX H100, 8x GPU"),
    "H200": _per_gpu(50.44, 8, "NVIDIA HGX H200, 8x GPU"),
    "B200": _per_gpu(68.80, 8, "NVIDIA B200, 8x GPU"),
    "GB200": _per_gpu(42.00, 4, "NVIDIA GB200 NVL72, 4-GPU slice"),
}
