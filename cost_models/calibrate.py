"""Refine a profile's constants from measured validate runs (``ntp calibrate``).

Each run (``RunRecord``, one JSON line that ``ntp validate --profile P --record runs.jsonl``
appends) carries the measured step time and the prediction split in two: the time that scales
with the device's compute (block compute, the optimizer, and the compute share of the pipeline
bubble) and the time that scales with its links (TP, CP and DP collectives, pipeline sends and
their share of the bubble). A bounded least-squares fit (scipy's ``lsq_linear``)

    measured = a * compute_s + b * comm_s + c

gives multipliers ``a`` on the profile's compute and ``b`` on its collectives and a fixed per-step
overhead ``c``. Small physical constants, not a curve fit per run: three numbers for all runs,
each reported with its residual.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cost_models.profile import CalibratedRun, Calibration, Profile
from topologies.bounds import Bound, bounds_validator
from topologies.cluster_catalogue import first_error
from topologies.errors import InputError
from topologies.files import parse, read_text

MAX_RUNS_BYTES = 16 * 2**20
MIN_RUNS = 3  # three constants
SCALE_RANGE = (0.05, 20.0)  # a multiplier outside this says the profile is of another machine

_TIME = Bound(0, 10**6, "s", "a validate step takes milliseconds to seconds")


class RunRecord(BaseModel):
    """One validate run with its prediction, as ``ntp validate --record`` writes it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(max_length=500, description="What ran: the plan file and its layout.")
    profile_created: datetime = Field(description="``created`` of the profile the prediction used.")
    profile_gpu: str = Field(max_length=100)
    measured_step_time_s: float = Field(gt=0)
    predicted_step_time_s: float = Field(gt=0)
    compute_s: float = Field(ge=0, description="Predicted time that scales with compute.")
    comm_s: float = Field(ge=0, description="Predicted time that scales with the links.")
    overhead_s: float = Field(ge=0, description="The fixed per-step overhead of the prediction.")
    compute_scale: float = Field(default=1.0, gt=0, description="The profile's calibration when it predicted.")
    comm_scale: float = Field(default=1.0, gt=0, description="The profile's calibration when it predicted.")

    _bounds = bounds_validator(
        {k: _TIME for k in ("measured_step_time_s", "predicted_step_time_s", "compute_s", "comm_s", "overhead_s")}
    )


def read_runs(path: Path) -> list[RunRecord]:
    """The records of a JSON-lines file, one per non-empty line; InputError naming the line."""
    text = read_text(path, "runs file", MAX_RUNS_BYTES)
    runs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:  # parse: duplicate keys, nesting past a few levels and integers of 4,300 digits are refused too
            runs.append(RunRecord.model_validate(parse(line, f"{path} line {number}", "runs file", "JSON")))
        except ValidationError as exc:
            raise InputError(f"runs file {path} line {number}: {first_error(exc)}") from None
    return runs


def calibrate(profile: Profile, runs: list[RunRecord]) -> Profile:
    """``profile`` with its calibration refitted to ``runs`` (each predicted with ``profile``)."""
    import numpy as np
    from scipy.optimize import lsq_linear

    if len(runs) < MIN_RUNS:
        raise InputError(
            f"calibration fits {MIN_RUNS} constants and needs at least {MIN_RUNS} runs; got {len(runs)}: record more "
            "with `ntp validate PLAN --profile P --record runs.jsonl`."
        )
    cal = profile.calibration
    other = [
        r
        for r in runs
        if (r.profile_created, r.profile_gpu) != (profile.created, profile.device.gpu)
        or not (math.isclose(r.compute_scale, cal.compute_scale) and math.isclose(r.comm_scale, cal.comm_scale))
    ]
    if other:
        r = other[0]
        raise InputError(
            f"run {r.name!r} was predicted with another profile ({r.profile_gpu}, {r.profile_created:%Y-%m-%d %H:%M}, "
            f"multipliers {r.compute_scale:.3g} and {r.comm_scale:.3g}); calibrate the profile the runs used."
        )
    measured = np.array([r.measured_step_time_s for r in runs])
    # relative least squares: every run counts alike, however long its step
    a = np.array([[r.compute_s, r.comm_s, 1.0] for r in runs]) / measured[:, None]
    if np.linalg.matrix_rank(a, tol=1e-9 * np.abs(a).max()) < 3:
        raise InputError(
            "these runs cannot tell compute, communication and a fixed overhead apart (one is zero in every run, or "
            "they grow in proportion); record runs that differ in their share of communication (other TP, DP or PP)."
        )
    lo, hi = SCALE_RANGE
    fit = lsq_linear(a, np.ones(len(runs)), bounds=([lo, lo, 0.0], [hi, hi, np.inf]))
    x, y, overhead = (float(v) for v in fit.x)
    fitted = [
        CalibratedRun(
            name=r.name,
            measured_step_time_s=r.measured_step_time_s,
            predicted_before_s=r.predicted_step_time_s,
            predicted_after_s=x * r.compute_s + y * r.comm_s + overhead,
        )
        for r in runs
    ]
    calibration = Calibration(
        compute_scale=cal.compute_scale * x,
        comm_scale=cal.comm_scale * y,
        step_overhead_s=overhead,
        runs=tuple(fitted),
    )
    return profile.model_copy(update={"calibration": calibration})
