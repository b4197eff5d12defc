"""The cluster file of the machine a profile was measured on, so a plan can be made for the very
machine that will run it. Pure: reads the profile, imports no torch.

One host: domain_size = gpus_per_node = the profile's device count, and scale-out the same links
as scale-up (there is no second host to measure). Bandwidth and latency are set so that
``cost_models.collectives`` reproduces the measured fits: it divides the link rate by its NCCL
efficiency (``Efficiency.nvlink_efficiency``) and charges an all-reduce 2 ceil(log2 n) latency steps
(``collectives._latency``), so the link rate is the fitted send/recv rate / that efficiency and the
step latency the all-reduce intercept / the steps.
"""

from __future__ import annotations

import math

from cost_models.efficiency import Efficiency
from cost_models.profile import Profile
from ntp_planner.profiler.fit import MAX_BW_BYTES_PER_S
from topologies.cluster_catalogue import ClusterSpec
from topologies.gpus import GPUS, GPUSpec

# compute capability major -> architecture (the tensor-core generation decides the formats)
ARCHITECTURES = {8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}
CPU_WATTS_PER_CORE = 10.0  # assumed: server CPUs draw ~5-15 W per core at full load
LINK_BW = (1e8, 1e14)  # bytes/s a cluster file admits (topologies.cluster_catalogue's bounds)
GPU_WATTS = 700.0  # assumed for an unknown GPU: a Hopper SXM board's TDP


def _custom_gpu(profile: Profile, by: str) -> GPUSpec:
    d = profile.device
    gemm = max(profile.gemms, key=lambda g: g.flops_per_s)
    copy = max((p for p in profile.passes if p.op == "copy"), key=lambda p: p.bytes_per_s)
    if d.kind == "cpu":
        arch, units = "cpu", max(1, d.cores // d.count)
        units_src, watts = f"{by}: {units} of the {d.cores} cores per process", CPU_WATTS_PER_CORE * units
        watts_src = f"assumed: {CPU_WATTS_PER_CORE:g} W per core"
    else:
        major = int((d.compute_capability or "0").split(".")[0])
        arch, units = ARCHITECTURES.get(major, "hopper"), d.multiprocessors or 1
        units_src, watts, watts_src = f"{by}: torch's multi_processor_count", GPU_WATTS, "assumed: an H100 SXM's 700 W"
    return GPUSpec(
        name=d.gpu, architecture=arch, sm_count=units, bf16_flops_per_s=gemm.flops_per_s,
        hbm_bytes=d.memory_bytes, hbm_bw_bytes_per_s=copy.bytes_per_s, tdp_watts=watts,
        sources={
            "architecture": f"{by}: {d.kind} {d.compute_capability or ''}".strip(),
            "bf16_flops_per_s": f"{by}: best GEMM ({gemm.m}x{gemm.n}x{gemm.k}) in {profile.dtype}",
            "sm_count": units_src,
            "hbm_bytes": f"{by}: memory of one device ({'host memory / processes' if d.kind == 'cpu' else 'torch'})",
            "hbm_bw_bytes_per_s": f"{by}: copy of {copy.bytes / 2**20:.0f} MiB (read + write)",
            "tdp_watts": watts_src,
        },
    )  # fmt: skip


def _links(profile: Profile, by: str) -> tuple[float, float, dict[str, str]]:
    """(link rate, step latency, their sources) from the collective fits of the largest group."""
    eff = Efficiency().nvlink_efficiency
    n = profile.device.count
    p2p, ar = profile.collective_fit("send_recv", 2), profile.collective_fit("all_reduce", n)
    if p2p is not None and p2p.bw_bytes_per_s >= MAX_BW_BYTES_PER_S and ar is not None:
        p2p = None  # a flat send/recv fit (latency only, small messages): the all-reduce's slope instead
    if p2p is None and ar is None:
        copy = max((p for p in profile.passes if p.op == "copy"), key=lambda p: p.bytes_per_s)
        why = f"{by}: no collectives measured (one device); the memory copy rate stands in"
        return copy.bytes_per_s, 1e-6, {"bw": why, "lat": "assumed: 1 us per step (no collectives measured)"}
    if p2p is not None:
        bw, bw_src = p2p.bw_bytes_per_s / eff, f"send/recv fit {p2p.bw_bytes_per_s:.3g} B/s / efficiency {eff:g}"
    else:
        bw = ar.bw_bytes_per_s * 2 * (n - 1) / n / eff
        bw_src = f"all-reduce fit {ar.bw_bytes_per_s:.3g} B/s x 2(n-1)/n / efficiency {eff:g}"
    steps = 2 * math.ceil(math.log2(max(n, 2)))
    if ar is not None:
        lat, lat_src = ar.alpha_s / steps, f"all-reduce intercept {ar.alpha_s:.3g} s on {n} ranks / {steps} steps"
    else:
        lat, lat_src = p2p.alpha_s, f"send/recv intercept {p2p.alpha_s:.3g} s"
    if not LINK_BW[0] <= bw <= LINK_BW[1]:
        bw, bw_src = min(max(bw, LINK_BW[0]), LINK_BW[1]), f"{bw_src}, clamped to a cluster file's range"
    return bw, lat, {"bw": f"{by}: {bw_src}", "lat": f"{by}: {lat_src}"}


def local_cluster(profile: Profile, name: str | None = None) -> ClusterSpec:
    """A one-host cluster of ``profile.device.count`` devices of ``profile.device.gpu``: the
    catalogue GPU, or for a CPU or an unknown GPU a custom one built from the measurements."""
    d = profile.device
    by = f"measured by ntp profile on {profile.created:%Y-%m-%d}"
    custom = None if d.gpu in GPUS else _custom_gpu(profile, by)
    bw, lat, src = _links(profile, by)
    host = f"assumed: one host of {d.count} {d.kind} device(s), the machine profiled"
    return ClusterSpec(
        name=name or f"local-{d.gpu}",
        description=f"{d.count} x {d.name} ({d.backend}), measured by ntp profile on {profile.created:%Y-%m-%d}",
        gpu=d.gpu, custom_gpu=custom, domain_size=d.count, gpus_per_node=d.count,
        nvlink_bw_bytes_per_s=bw, nvlink_latency_s=lat, scaleout_bw_bytes_per_s=bw, scaleout_latency_s=lat,
        nodes_per_leaf=1,
        sources={
            "nvlink_bw_bytes_per_s": src["bw"], "nvlink_latency_s": src["lat"],
            "scaleout_bw_bytes_per_s": f"{src['bw']} (one host: no scale-out link; the same figure)",
            "scaleout_latency_s": f"{src['lat']} (one host: the same figure)",
            "domain_size": host, "gpus_per_node": host, "nodes_per_leaf": "one host",
        },
    )  # fmt: skip
