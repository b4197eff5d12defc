"""What ``ntp capacity`` searches and what it answers: the spec (tokens, deadline, confidence and
the grid of candidates), a candidate and the result; and the workload a spec may ask for, refused
up front with the arithmetic when it would hold GBs or run for hours.

The limits are shared with the simulation of one candidate (``capacity_job.train_hours``): it
simulates at most MAX_SLOWDOWN times a job's failure-free time, MAX_HORIZON_H or MAX_CELLS
trial-bins, so these checks bound what any candidate may draw.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from ntp_planner.failures import capacity_sim as sim
from ntp_planner.failures.sim_config import MAX_EVENTS, MAX_EVENTS_PER_TRIAL, STRATEGIES, SimConfig
from topologies.errors import InputError

HORIZON_SLACK = 1.25  # first horizon: this times the failure-free time, plus a day
MAX_SLOWDOWN = 16  # a trial not done in this times its failure-free time (or MAX_CELLS) counts as never done
MAX_HORIZON_H = 3650 * 24  # ten years
MAX_CELLS = 20_000_000  # trials x time bins of one job: ~160 MB a float array, a few of them at once
# Trials x bins over the whole search (every candidate simulated, to the deadline): the brute force
# of benchmarks/capacity.py, 480 x 200 trials x 3,648 bins = 3.5e8, took 87 s on 2 cores, so this
# is at most ~8 minutes unpruned (the pruned search simulates a sixth); 1,000 trials of that grid pass.
MAX_SEARCH_CELLS = 2_000_000_000


class CapacitySpec(BaseModel):
    """What to train and by when, and the grid of candidates to search."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    tokens: float = Field(gt=0, le=1e18, description="Tokens to train (15e12 for Llama 3).")
    deadline_days: float = Field(gt=0, le=3650, description="Days by which the tokens must be trained.")
    confidence: float = Field(gt=0, lt=1, description="Probability of meeting the deadline asked for.")
    gpus: tuple[int, ...] = Field(min_length=1, description="GPU counts to try, per cluster.")
    spares: tuple[int, ...] = Field(default=(0,), min_length=1, description="Spare NVLink domains to try.")
    strategies: tuple[str, ...] = Field(default=STRATEGIES, min_length=1, description="Fault strategies to try.")
    trials: int = Field(default=200, ge=1, le=100_000, description="Monte-Carlo trials per candidate.")
    seed: int = Field(default=0, ge=0, description="Seed of the failures every candidate meets.")
    sim: SimConfig = Field(default_factory=SimConfig, description="Failure model and recovery costs (days unused).")


class Candidate(BaseModel):
    """One cluster x GPU count x spare count x strategy, and how it did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster: str = Field(description="Cluster catalogue name.")
    gpus: int = Field(description="GPUs the job trains on.")
    spares: int = Field(description="Spare NVLink domains held for it.")
    strategy: str = Field(description="Fault strategy.")
    paid_gpus: int = Field(description="GPUs paid for: the NVLink domains the job touches, and the spares.")
    usd_per_gpu_hour: float = Field(description="Price of one GPU-hour.")
    layout: str | None = Field(default=None, description="The plan's layout; None when none fits.")
    tokens_per_s: float | None = Field(default=None, description="Failure-free training throughput.")
    checkpoint_interval_s: float | None = Field(default=None, description="Compute between checkpoints (Daly).")
    failure_free_days: float | None = Field(default=None, description="Time to train without failures.")
    p50_days: float | None = Field(default=None, description="Median time to train over trials (None: pruned).")
    p90_days: float | None = Field(default=None, description="90th percentile of the time to train.")
    days_at_confidence: float | None = Field(default=None, description="Time to train at the confidence.")
    p_deadline: float | None = Field(default=None, description="Share of trials done by the deadline.")
    gpu_hours: float | None = Field(default=None, description="Mean GPU-hours paid (spares included).")
    cost_usd: float | None = Field(default=None, description="Mean cost.")
    cost_usd_p90: float | None = Field(default=None, description="Cost at the P90 time to train.")
    verdict: str = Field(default="lost", description="cheapest, front (the time/cost front) or lost.")
    reason: str = Field(default="", description="Why it lost, in a sentence.")

    @property
    def label(self) -> str:
        """'gb200-nvl72 x 16384 + 2 spares, ntp'"""
        return f"{self.cluster} x {self.gpus} + {self.spares} spare{'s' if self.spares != 1 else ''}, {self.strategy}"


class CapacityResult(BaseModel):
    """Every candidate, the cheapest that meets the deadline and the time/cost front."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidates: list[Candidate] = Field(description="In grid order: cluster, GPUs, spares, strategy.")
    cheapest: Candidate | None = Field(description="Cheapest candidate that meets the deadline; None if none does.")
    front: list[Candidate] = Field(description="Time/cost front of the candidates meeting the deadline, by cost.")
    simulated: int = Field(description="Candidates simulated (the rest were planned out or pruned by bounds).")


def check_workload(spec: CapacitySpec, clusters: int = 1) -> None:
    """InputError, with the arithmetic, for a search that would hold GBs or run for hours: the
    failures of the largest job until the deadline (bounds of ``sim_config``: MAX_EVENTS_PER_TRIAL
    failures a trial, MAX_EVENTS drawn, measured there), one job's trials x time bins to the
    deadline, and every candidate's (``clusters`` x GPU counts x spares x strategies)."""
    hours = spec.deadline_days * 24 * HORIZON_SLACK + 24
    cells = spec.trials * hours * 3600 / sim.BIN_S
    if cells > MAX_CELLS:
        raise InputError(
            f"trials({spec.trials:,}) x {hours * 3600 / sim.BIN_S:,.0f} time bins of {sim.BIN_S} s to the deadline "
            f"= {cells:.3g} is over {MAX_CELLS:.3g} (GBs of memory); lower --trials or --deadline-days"
        )
    _check_events(spec, hours)
    candidates = clusters * len(spec.gpus) * len(spec.spares) * len(spec.strategies)
    if candidates * cells > MAX_SEARCH_CELLS:
        raise InputError(
            f"{candidates:,} candidates ({clusters} clusters x {len(spec.gpus)} GPU counts x {len(spec.spares)} spare "
            f"counts x {len(spec.strategies)} strategies) x trials({spec.trials:,}) x {hours * 3600 / sim.BIN_S:,.0f} "
            f"time bins = {candidates * cells:.3g} is over {MAX_SEARCH_CELLS:.3g} (minutes of simulating); lower "
            "--trials, --deadline-days or the grid"
        )


def _check_events(spec: CapacitySpec, hours: float) -> None:
    """InputError for more failures than a trial or the whole pool may draw: the pool draws every
    trial's failures on the largest job in whole chunks of CHUNK_H hours, up to the longest horizon
    a candidate may simulate (``train_hours``' cap for a job done by the deadline)."""
    rate, gpus = spec.sim.failure_rate_per_gpu_hour, max(spec.gpus)
    if rate * gpus * (hours + spec.sim.warm_h) > MAX_EVENTS_PER_TRIAL:
        raise InputError(
            f"failure rate({rate:.3g} per GPU-hour) x {gpus:,} GPUs x {hours + spec.sim.warm_h:,.0f} h (the deadline, "
            f"with slack and warm-up) = {rate * gpus * (hours + spec.sim.warm_h):,.0f} failures a trial is over "
            f"{MAX_EVENTS_PER_TRIAL:,} (hours of re-planning); lower --gpus or --deadline-days"
        )
    longest_h = min(
        MAX_HORIZON_H, MAX_SLOWDOWN * spec.deadline_days * 24 + 24, MAX_CELLS / spec.trials * sim.BIN_S / 3600
    )
    drawn_h = math.ceil(longest_h / sim.CHUNK_H) * sim.CHUNK_H + spec.sim.warm_h
    events = rate * gpus * drawn_h * spec.trials
    if events > MAX_EVENTS:
        raise InputError(
            f"failure rate({rate:.3g} per GPU-hour) x {gpus:,} GPUs x {drawn_h:,.0f} h (whole {sim.CHUNK_H} h chunks "
            f"of failures to the longest horizon) x trials({spec.trials:,}) = {events:.3g} failures to draw is over "
            f"{MAX_EVENTS:.3g} (GBs of memory); lower --trials or --gpus"
        )


def check_one_step(tokens: float, training) -> None:
    """InputError for fewer tokens than one step (a ``TrainingSpec``'s global batch x sequence
    length) trains: a run of a fraction of a step has no time to train worth pricing (it would
    read as 0 days and $0)."""
    step_tokens = training.global_batch * training.seq_len
    if tokens < step_tokens:
        raise InputError(
            f"--tokens {tokens:g} is less than one step: global batch({training.global_batch:,}) x seq len"
            f"({training.seq_len:,}) = {step_tokens:,} tokens; train at least that many"
        )
