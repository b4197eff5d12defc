"""One ``Profile`` of the machine it runs on: device information, then every table (GEMMs first,
whose rate decides whether the blocks are affordable, then blocks, attention, passes and
collectives with their fits), and a note for whatever was skipped."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from datetime import datetime, timezone

import torch

from cost_models.profile import Profile, ProfileDevice
from ntp_planner.profiler.blocks import SKIPPED, block_flops, measure_blocks
from ntp_planner.profiler.collectives import CollectiveSweep, measure_collectives, message_sizes
from ntp_planner.profiler.fit import fit_collectives
from ntp_planner.profiler.kernels import measure_attention, measure_gemms, measure_passes
from ntp_planner.profiler.settings import ProfileSettings
from ntp_planner.profiler.timing import threads
from topologies.errors import InputError

MAX_PROCS_PER_CORE = 8  # CPU profiles: `ntp validate` runs 16 processes on 2 cores by default

# substring of torch's device name -> GPU catalogue name, first match wins (GB200 before B200)
CATALOGUE_GPUS = (
    ("GB200", "GB200"),
    ("B200", "B200"),
    ("H200", "H200"),
    ("H100", "H100-SXM"),
    ("A100", "A100-SXM4-80GB"),
)
BLOCK_BUDGET_S = {False: 20 * 60, True: 30}  # longest block measurement we start (quick or not)


def gpu_name(kind: str, device_name: str) -> str:
    """The catalogue GPU a device stands for, or a custom name for a CPU or an unknown GPU.

    >>> gpu_name("cuda", "NVIDIA H100 80GB HBM3"), gpu_name("cpu", "AMD EPYC 7B13 64-Core Processor")
    ('H100-SXM', 'cpu-amd-epyc-7b13-64-core-processor')
    """
    if kind == "cuda":
        for part, name in CATALOGUE_GPUS:
            if part in device_name.upper():
                return name
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")[:60] or "unknown"
    return f"{kind}-{slug}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _driver_version() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def device_info(settings: ProfileSettings) -> ProfileDevice:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    common = dict(count=settings.nproc, cores=cores, backend=settings.backend, torch_version=torch.__version__)
    if settings.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return ProfileDevice(
            kind="cuda", name=props.name, gpu=gpu_name("cuda", props.name), memory_bytes=float(props.total_memory),
            cuda_version=torch.version.cuda, driver_version=_driver_version(),
            compute_capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count, **common,
        )  # fmt: skip
    name = _cpu_model()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ProfileDevice(
        kind="cpu", name=name, gpu=gpu_name("cpu", name), memory_bytes=memory / settings.nproc, **common
    )


def check_affordable(settings: ProfileSettings, flops_per_s: float) -> None:
    """InputError when the blocks would take longer than ``BLOCK_BUDGET_S`` at the measured GEMM
    rate: each request runs (warm-up + reps) forwards, then as many forward + backward pairs
    (backward about twice the forward's FLOPs): 4 forwards' worth per repetition."""
    flops = sum(block_flops(s, b) for s, b in settings.block_requests() if s.kind not in SKIPPED)
    seconds = 4 * (settings.reps + 1) * flops / flops_per_s
    budget = BLOCK_BUDGET_S[settings.quick]
    if seconds > budget:
        raise InputError(
            f"measuring {settings.model.name}'s blocks at {settings.seq_len} tokens would take about "
            f"{seconds / 60:.0f} min on this {settings.device} ({flops:.2g} FLOPs per pass at the measured "
            f"{flops_per_s:.2g} FLOP/s; "
            f"the limit is {budget / 60:g} min); shorten --seq-len, lower --micro-batches or --tp, or choose a smaller "
            "--model"
        )


def profile_machine(settings: ProfileSettings, tick: Callable[[str], None] | None = None) -> Profile:
    """Measure everything ``settings`` asks for on this machine. ``tick(label)`` hears each
    measurement as it ends (``task_count`` of them)."""
    device, dtype = torch.device(settings.device), getattr(torch, settings.dtype)
    torch.manual_seed(settings.seed)
    notes = [SKIPPED[s.kind] for s in settings.block_shapes() if s.kind in SKIPPED][:1]
    info = device_info(settings)
    with threads(settings.threads):
        cubes, model_shaped = settings.gemm_shapes()
        gemms = measure_gemms(cubes, device, dtype, settings.reps, tick)
        check_affordable(settings, max(g.flops_per_s for g in gemms))  # before any model-sized work
        gemms += measure_gemms(model_shaped, device, dtype, settings.reps, tick)
        blocks = measure_blocks(
            settings.block_requests(), device, dtype, reps=settings.reps, seed=settings.seed, tick=tick
        )
        attention = measure_attention(settings.attention_shapes(), device, dtype, settings.reps, tick)
        passes = measure_passes(*settings.pass_sizes(), device, dtype, settings.reps, tick)
    collectives = []
    if settings.nproc > 1:
        sweep = collective_sweep(settings)
        collectives = measure_collectives(sweep, tick)
    else:
        notes.append("collectives were not measured: one process (--nproc 1)")
    if settings.device == "cpu":
        notes.append(
            f"CPU profile: each of the {settings.nproc} processes stands for one device and runs "
            f"{settings.threads} torch thread(s); blocks, GEMMs and passes ran with as many"
        )
    if not settings.model.gated_mlp:
        notes.append(f"{settings.model.name} has a 2-matrix MLP; the executor's layer (measured) runs SwiGLU's 3")
    return Profile(
        created=datetime.now(timezone.utc), device=info, dtype=settings.dtype, model=settings.model.name,
        blocks=tuple(blocks), gemms=tuple(gemms), attention=tuple(attention), passes=tuple(passes),
        collectives=tuple(collectives), collective_fits=tuple(fit_collectives(collectives)), notes=tuple(notes),
    )  # fmt: skip


def collective_sweep(settings: ProfileSettings) -> CollectiveSweep:
    return CollectiveSweep(
        nproc=settings.nproc, backend=settings.backend, device=settings.device, dtype=settings.dtype,
        sizes=message_sizes(settings.max_message_bytes), iters=10 if settings.quick else 20,
        warmup=1 if settings.quick else 2,
    )  # fmt: skip


def task_count(settings: ProfileSettings) -> int:
    """Measurements ``profile_machine`` ticks: for a progress bar's total."""
    blocks = [r for r in settings.block_requests() if r[0].kind not in SKIPPED]
    kernels = sum(map(len, settings.gemm_shapes())) + len(settings.attention_shapes()) + 4
    return kernels + len(blocks) + (len(collective_sweep(settings).tasks()) if settings.nproc > 1 else 0)


def resolve_settings(
    device: str | None,
    backend: str | None,
    nproc: int | None,
    model: str | None,
    dtype: str | None,
    seq_len: int | None,
    micro_batches: tuple[int, ...] | None,
    tps: tuple[int, ...] | None,
    quick: bool = False,
    seed: int = 0,
) -> ProfileSettings:
    """``ProfileSettings`` from the command's choices, None meaning the device's default
    (``settings`` module docstring); InputError in one sentence for a choice this machine cannot run."""
    from cost_models import resolve_model
    from ntp_planner.profiler.settings import check_degrees, dtype_name
    from ntp_planner.solver.search import tp_degrees

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = device or ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        raise InputError("--device cuda needs a CUDA GPU and torch sees none here; use --device cpu")
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    if backend == "nccl" and device == "cpu":
        raise InputError("--backend nccl runs on CUDA GPUs only; use --backend gloo with --device cpu")
    nproc = nproc or (gpus if device == "cuda" else 2)
    if nproc < 1:
        raise InputError(f"--nproc {nproc} must be at least 1")
    if device == "cuda" and nproc > gpus:
        raise InputError(f"--nproc {nproc} exceeds the {gpus} GPUs here (one process per GPU); lower --nproc")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if device == "cpu" and nproc > MAX_PROCS_PER_CORE * cores:
        raise InputError(
            f"--nproc {nproc} would run {nproc / cores:.3g} processes on each of this host's {cores} cores; beyond "
            f"{MAX_PROCS_PER_CORE} per core the collectives time the OS scheduler: use at most "
            f"{MAX_PROCS_PER_CORE * cores}"
        )
    spec = resolve_model(model or ("llama3-8b" if device == "cuda" else "llama2-7b"))
    tps = tps or tuple(t for t in tp_degrees(spec, nproc) if t <= nproc)
    check_degrees(spec, tps, nproc)
    return ProfileSettings(
        device=device, backend=backend, nproc=nproc, model=spec,
        dtype=dtype_name(dtype or ("bfloat16" if device == "cuda" else "float32"), "--dtype"),
        seq_len=seq_len or (64 if quick else 4096 if device == "cuda" else 256),
        micro_batches=micro_batches or ((1,) if quick else (1, 2, 4) if device == "cuda" else (1, 2)),
        tps=tuple(sorted(set(tps))), quick=quick, seed=seed,
        threads=None if device == "cuda" else max(1, cores // nproc),
    )  # fmt: skip
