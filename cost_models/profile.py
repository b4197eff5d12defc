"""A measured profile of one machine (``ntp profile``) and the lookups the cost model makes into it.

A profile holds what torch measured on the device it ran on, every figure with its unit in its
name: the executor's real blocks (embedding, transformer layer, MoE layer, LM head with loss)
forward and backward at the shard shape of each TP degree (``blocks``), GEMM throughput over a
sweep of shapes (``gemms``), fused attention (``attention``), memory-bound passes as bandwidth
(``passes``), and collectives on real process groups (``collectives``) with their alpha-beta fit
per operation and group size (``collective_fits``): ``time_s = alpha_s + bytes / bw_bytes_per_s``,
``bytes`` counted as the cost model counts them (``cost_models.collectives``: the full buffer on
each rank; for all-gather the gathered size; for all-to-all everything one rank sends).

Lookups (``block_time``, ``collective_time``) answer None where the profile did not measure the
shape; the cost model then falls back to its analytical term and says so. Pure data: no torch.
"""

from __future__ import annotations

import bisect
import json
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from topologies.bounds import Bound, bounds_validator
from topologies.cluster_catalogue import first_error
from topologies.errors import InputError
from topologies.files import read_mapping

SCHEMA_VERSION = 1
MAX_PROFILE_BYTES = 64 * 2**20  # a full profile is a few hundred kilobytes

BlockKind = Literal["embedding", "layer", "moe_layer", "head"]
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
PassOp = Literal["norm", "activation", "optimizer", "copy"]

_TIME = Bound(0, 3600, "s", "one measured kernel, block or collective takes microseconds to seconds")
_COUNT = Bound(1, 10**9, "", "model dimensions and group sizes are at most a few million")
_BYTES = Bound(0, 2**50, "bytes", "a measured message or pass moves kilobytes to gigabytes")
_RATE = Bound(0, 1e18, "per s", "no device moves or computes more than 1e18 per second")

_Strict = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _positive_time(cls, value: float) -> float:
    """A measured time of zero is a broken timer, not a fast kernel: rates and fits divide by it."""
    if value <= 0:
        raise InputError(f"must be above 0 s, not {value:g}: a measurement takes some time")
    return value


def measured_time_validator():
    """The pydantic validator of a ``time_s`` field that was measured (``_positive_time``)."""
    return field_validator("time_s")(classmethod(_positive_time))


class ProfileDevice(BaseModel):
    """Where the profile was measured."""

    model_config = _Strict

    kind: Literal["cuda", "cpu"] = Field(description="torch device type the blocks ran on.")
    name: str = Field(max_length=200, description="The device as torch reports it (GPU name or CPU model).")
    gpu: str = Field(
        min_length=1,
        max_length=100,
        description="The GPU this profile stands for: a catalogue name (see `ntp clusters`) or, for a CPU host, "
        "the name of the custom GPU in the local cluster file `ntp profile` wrote. A cluster's GPU must match it.",
    )
    count: int = Field(ge=1, le=4096, description="Devices (processes on CPU) the collectives were measured on.")
    cores: int = Field(ge=1, le=100_000, description="CPU cores the profiling process could use.")
    memory_bytes: float = Field(gt=0, le=2**50, description="Memory of one device (on CPU: host memory / count).")
    backend: Literal["nccl", "gloo"] = Field(description="torch.distributed backend of the collectives.")
    torch_version: str = Field(max_length=100)
    cuda_version: str | None = Field(default=None, max_length=100, description="CUDA runtime torch was built with.")
    driver_version: str | None = Field(default=None, max_length=100, description="GPU driver, where known.")
    compute_capability: str | None = Field(
        default=None, max_length=20, description="CUDA compute capability, e.g. '9.0' (decides the architecture)."
    )
    multiprocessors: int | None = Field(default=None, ge=1, le=10_000, description="SMs of one GPU; None on CPU.")


class BlockShape(BaseModel):
    """One block at one TP degree, as a rank of its TP group runs it."""

    model_config = _Strict

    kind: BlockKind
    hidden: int = Field(description="Model width h.")
    heads: int = Field(description="Query heads of the whole layer (the shard holds heads / tp of them).")
    kv_heads: int
    head_dim: int
    ffn: int = Field(description="FFN hidden width of the whole layer (of one expert for MoE).")
    vocab: int
    experts: int = Field(default=0, ge=0, description="Routed experts of a MoE layer; 0 for dense blocks.")
    top_k: int = Field(default=0, ge=0)
    tp: int = Field(description="TP degree: the rank holds the 1/tp shard.")
    seq_len: int = Field(description="Tokens of each sequence the rank processes (seq_len / cp).")
    cp: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="Context-parallel degree: attention reads the keys of cp x seq_len tokens.",
    )

    _bounds = bounds_validator(
        dict.fromkeys(("hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "tp", "seq_len"), _COUNT)
    )


class BlockTime(BaseModel):
    """Median forward and backward time of one micro-batch through one block on one rank,
    communication excluded (the collectives are timed on their own)."""

    model_config = _Strict

    shape: BlockShape
    micro_batch: int = Field(ge=1, le=10**6, description="Sequences in the micro-batch the TP group processes.")
    fwd_s: float
    bwd_s: float = Field(description="Backward alone (input and weight gradients).")
    samples: int = Field(ge=1, description="Timed repetitions behind each median.")

    _bounds = bounds_validator({"fwd_s": _TIME, "bwd_s": _TIME})


class GemmTime(BaseModel):
    """One ``[m, k] x [k, n]`` matrix product."""

    model_config = _Strict

    m: int
    n: int
    k: int
    time_s: float
    flops_per_s: float

    _bounds = bounds_validator({"m": _COUNT, "n": _COUNT, "k": _COUNT, "time_s": _TIME, "flops_per_s": _RATE})


class AttentionTime(BaseModel):
    """Fused (scaled-dot-product) attention, causal, forward and backward."""

    model_config = _Strict

    batch: int
    heads: int
    seq_len: int
    head_dim: int
    kernel: str = Field(max_length=100, description="The SDPA backend torch chose (flash, efficient, math, cpu).")
    fwd_s: float
    bwd_s: float
    fwd_flops_per_s: float = Field(description="Forward FLOPs (the causal half of 4 b h s^2 d) per second.")

    _bounds = bounds_validator(
        {"batch": _COUNT, "heads": _COUNT, "seq_len": _COUNT, "head_dim": _COUNT, "fwd_s": _TIME, "bwd_s": _TIME,
         "fwd_flops_per_s": _RATE}
    )  # fmt: skip


class PassTime(BaseModel):
    """A memory-bound pass (RMSNorm, SwiGLU activation, an Adam step, a copy) as bandwidth."""

    model_config = _Strict

    op: PassOp
    bytes: float = Field(description="Bytes the pass reads and writes.")
    tensors: int = Field(default=1, ge=1, le=10**6, description="Tensors it runs over (each costs a fixed time).")
    time_s: float
    bytes_per_s: float

    _bounds = bounds_validator({"bytes": _BYTES, "time_s": _TIME, "bytes_per_s": _RATE})
    _measured = measured_time_validator()


class CollectiveTime(BaseModel):
    """Median time of one collective on a real process group."""

    model_config = _Strict

    op: CollectiveOp
    group_size: int = Field(ge=2, le=4096)
    bytes: float = Field(description="Message size as the cost model counts it (see the module docstring).")
    time_s: float

    _bounds = bounds_validator({"bytes": _BYTES, "time_s": _TIME})
    _measured = measured_time_validator()


class CollectiveFit(BaseModel):
    """``time_s = alpha_s + bytes / bw_bytes_per_s`` for one operation on groups of one size."""

    model_config = _Strict

    op: CollectiveOp
    group_size: int = Field(ge=2, le=4096)
    alpha_s: float = Field(description="Fixed cost of one call: latency and launch.")
    bw_bytes_per_s: float = Field(gt=0, description="Bytes (cost-model convention) moved per second.")
    max_rel_residual: float = Field(ge=0, description="Largest |fit - measured| / measured over the sizes.")

    _bounds = bounds_validator({"alpha_s": _TIME, "bw_bytes_per_s": _RATE})

    def time_s(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.bw_bytes_per_s


class CalibratedRun(BaseModel):
    """One validate run a calibration was fitted to."""

    model_config = _Strict

    name: str = Field(max_length=500)
    measured_step_time_s: float = Field(gt=0)
    predicted_before_s: float = Field(ge=0)
    predicted_after_s: float = Field(ge=0)

    @property
    def residual(self) -> float:
        """Relative error of the calibrated prediction."""
        return (self.predicted_after_s - self.measured_step_time_s) / self.measured_step_time_s


class Calibration(BaseModel):
    """Constants ``ntp calibrate`` fitted to measured validate runs: multipliers on the profile's
    compute and communication times and a fixed per-step overhead."""

    model_config = _Strict

    compute_scale: float = Field(default=1.0, gt=0, le=100, description="Multiplies every block time.")
    comm_scale: float = Field(default=1.0, gt=0, le=100, description="Multiplies every collective time.")
    step_overhead_s: float | None = Field(
        default=None, ge=0, le=3600, description="Fixed seconds per step; None keeps the cost model's own."
    )
    runs: tuple[CalibratedRun, ...] = Field(default=(), description="The runs of the fit, with their residuals.")


class Profile(BaseModel):
    """Everything ``ntp profile`` measured on one machine."""

    model_config = _Strict

    schema_version: Literal[1] = SCHEMA_VERSION
    created: datetime = Field(description="When the profile was measured (ISO 8601).")
    device: ProfileDevice
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = Field(
        description="torch dtype of the blocks, GEMMs and messages."
    )
    model: str | None = Field(default=None, max_length=200, description="The model whose blocks were measured.")
    blocks: tuple[BlockTime, ...] = ()
    gemms: tuple[GemmTime, ...] = ()
    attention: tuple[AttentionTime, ...] = ()
    passes: tuple[PassTime, ...] = ()
    collectives: tuple[CollectiveTime, ...] = ()
    collective_fits: tuple[CollectiveFit, ...] = ()
    calibration: Calibration = Calibration()
    notes: tuple[str, ...] = Field(default=(), description="What was skipped or approximated, one line each.")

    @model_validator(mode="after")
    def _one_entry_per_shape(self) -> Profile:
        seen: set = set()
        for i, b in enumerate(self.blocks):
            if (b.shape, b.micro_batch) in seen:
                raise InputError(
                    f"blocks.{i} measures {b.shape.kind} at tp {b.shape.tp}, {b.micro_batch} x {b.shape.seq_len} "
                    "tokens a second time; keep one entry per shape and micro-batch"
                )
            seen.add((b.shape, b.micro_batch))
        return self

    # ---- lookups ------------------------------------------------------------------------------
    def block_time(self, shape: BlockShape, micro_batch: int, extrapolate: bool = False) -> tuple[float, float] | None:
        """(forward, backward) seconds of ``shape`` at ``micro_batch`` sequences: measured, or
        interpolated linearly between the two measured micro-batch sizes either side. Beyond the
        measured sizes: None, or with ``extrapolate`` the line through the two nearest sizes (a
        block's time is a fixed part plus a part per sequence; one size alone scales in
        proportion). None for a shape never measured."""
        points = self._block_index().get(shape)
        if not points:
            return None
        sizes = [p[0] for p in points]
        i = bisect.bisect_left(sizes, micro_batch)
        if i < len(sizes) and sizes[i] == micro_batch:
            return points[i][1], points[i][2]
        if 0 < i < len(sizes):
            return _line(points[i - 1], points[i], micro_batch)
        if not extrapolate:
            return None
        if len(points) == 1:
            b, f, g = points[0]
            return f * micro_batch / b, g * micro_batch / b
        if i == 0:  # fewer sequences than measured: on the line, never below proportion
            first = points[0]
            fwd, bwd = _line(first, points[1], micro_batch)
            ratio = micro_batch / first[0]
            return min(max(fwd, ratio * first[1]), first[1]), min(max(bwd, ratio * first[2]), first[2])
        last = points[-1]  # more: on the line, never less than the largest measured
        fwd, bwd = _line(points[-2], last, micro_batch)
        return max(fwd, last[1]), max(bwd, last[2])

    def optimizer_cost(self) -> tuple[float, float] | None:
        """(seconds per tensor, bytes per second) of an optimizer step, fitted to the measured
        steps over different numbers of tensors (``time = tensors x a + bytes / bw``); None
        without two such measurements. Fitted once per set of passes (cached beside them)."""
        cached = self.__dict__.get("_optimizer")
        if cached is None or cached[0] is not self.passes:
            cached = self.__dict__["_optimizer"] = (self.passes, _fit_optimizer(self.passes))
        return cached[1]

    def collective_fit(self, op: str, group_size: int) -> CollectiveFit | None:
        return self._fit_index().get((op, group_size))

    def collective_time(self, op: str, group_size: int, nbytes: float) -> float | None:
        """Seconds of one ``op`` of ``nbytes`` on a group of ``group_size`` from the fit; None
        where that operation was not measured on groups of that size."""
        fit = self.collective_fit(op, group_size)
        return None if fit is None else fit.time_s(nbytes)

    def _block_index(self) -> dict[BlockShape, list[tuple[int, float, float]]]:
        """Measured (micro-batch, forward, backward) per shape, sorted; cached beside the blocks
        it was built from (a ``model_copy`` with other blocks builds its own)."""
        cached = self.__dict__.get("_blocks_by_shape")
        if cached is None or cached[0] is not self.blocks:
            index: dict[BlockShape, list[tuple[int, float, float]]] = {}
            for b in self.blocks:
                index.setdefault(b.shape, []).append((b.micro_batch, b.fwd_s, b.bwd_s))
            for points in index.values():
                points.sort()
            cached = self.__dict__["_blocks_by_shape"] = (self.blocks, index)
        return cached[1]

    def _fit_index(self) -> dict[tuple[str, int], CollectiveFit]:
        cached = self.__dict__.get("_fits")
        if cached is None or cached[0] is not self.collective_fits:
            cached = self.__dict__["_fits"] = (
                self.collective_fits,
                {(f.op, f.group_size): f for f in self.collective_fits},
            )
        return cached[1]

    # ---- checks -------------------------------------------------------------------------------
    def check_gpu(self, gpu_name: str, source: str = "the profile") -> None:
        """InputError unless the cluster's GPU is the one this profile was measured on."""
        if gpu_name.lower() != self.device.gpu.lower():
            raise InputError(
                f"{source} was measured on {self.device.name} ({self.device.gpu}) but the cluster's GPU is "
                f"{gpu_name}; plan for a cluster of {self.device.gpu} (the cluster file `ntp profile` wrote) or "
                f"profile a {gpu_name} machine."
            )


def _fit_optimizer(passes: tuple[PassTime, ...]) -> tuple[float, float] | None:
    """``Profile.optimizer_cost`` by least squares on relative error."""
    steps = [p for p in passes if p.op == "optimizer"]
    if len({p.tensors for p in steps}) < 2 or len({p.bytes for p in steps}) < 2:
        return None
    import numpy as np

    a = np.array([[p.tensors, p.bytes] for p in steps]) / np.array([[p.time_s] for p in steps])
    (per_tensor, per_byte), *_ = np.linalg.lstsq(a, np.ones(len(steps)), rcond=None)
    per_tensor, per_byte = max(float(per_tensor), 0.0), max(float(per_byte), 1e-15)
    return per_tensor, 1.0 / per_byte


def _line(a: tuple[int, float, float], b: tuple[int, float, float], x: int) -> tuple[float, float]:
    """(forward, backward) on the line through measured points ``a`` and ``b`` at ``x`` sequences."""
    w = (x - a[0]) / (b[0] - a[0])
    return a[1] + w * (b[1] - a[1]), a[2] + w * (b[2] - a[2])


def load_profile(path: Path) -> Profile:
    """Read a profile JSON file; InputError in one sentence if it is not one."""
    path = Path(path)
    data = read_mapping(path, "profile", MAX_PROFILE_BYTES, kind="JSON")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(
            f"profile {path} has schema_version {version!r}, not {SCHEMA_VERSION}; measure it again with `ntp profile`."
        )
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"profile {path}: {first_error(exc)}") from None


def profile_json(profile: Profile) -> str:
    """The profile as the JSON file ``load_profile`` reads (write it with ``ntp_planner.plan.write_atomic``)."""
    return json.dumps(profile.model_dump(mode="json"), indent=1) + "\n"
