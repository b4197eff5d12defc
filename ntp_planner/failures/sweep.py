"""Throughput loss over random failure placements: mean, p5 and p95 per policy and fraction.

Every sample draws one failure set (seeded) and evaluates every policy on that same set, so the
policies are compared on identical failures.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ntp_planner.failures.replan import Replanner
from ntp_planner.failures.sampling import Blast, lost_domains, random_failures
from ntp_planner.plan import Plan
from ntp_planner.replan_result import POLICIES, BatchMode
from topologies.errors import InputError

# ``benchmarks/replan.py``: 4 fractions x 200 samples x 3 policies = 2,400 re-plans of a
# 32,768-GPU plan take ~1.5 s; 100x that is a few minutes.
MAX_REPLANS = 240_000


class SweepRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str = Field(description="Re-planning policy.")
    fraction: float = Field(description="Share of blast units failed.")
    mean_loss: float = Field(description="Mean throughput loss (1 - relative throughput) over samples.")
    p5_loss: float = Field(description="5th percentile of the loss.")
    p95_loss: float = Field(description="95th percentile of the loss.")


def check_sweep(fractions: list[float], samples: int, policies: list[str]) -> None:
    """InputError, with the arithmetic, unless the sweep names known policies, at least one
    fraction and sample, and at most ``MAX_REPLANS`` re-plans."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise InputError(f"unknown policies {unknown or '(none)'}; choose from {', '.join(POLICIES)}")
    if samples < 1:
        raise InputError(f"samples {samples} must be at least 1")
    bad = [f for f in fractions if not 0 <= f < 1]  # NaN fails this too
    if bad or not fractions:
        raise InputError(f"fractions must be failed shares in [0, 1); got {bad or 'none'}")
    replans = samples * len(fractions) * len(policies)
    if replans > MAX_REPLANS:
        raise InputError(
            f"samples({samples:,}) x fractions({len(fractions)}) x policies({len(policies)}) = {replans:,} re-plans"
            f" is over {MAX_REPLANS:,} (minutes of work); lower samples"
        )


def sweep(
    plan: Plan,
    fractions: list[float],
    samples: int,
    policies: list[str],
    rng: np.random.Generator,
    spares: int = 0,
    fallback: str = "dp-drop",
    batch: BatchMode = "flexible",
    blast: Blast = "gpu",
    max_power: float = 1.3,
    progress: Callable[[], None] | None = None,
) -> list[SweepRow]:
    """Loss = 1 - throughput_relative, over ``samples`` random failure sets per fraction."""
    check_sweep(fractions, samples, policies)
    replanner = Replanner(plan, max_power)
    cluster = plan.cluster.build()
    rows = []
    for fraction in fractions:
        losses = {p: np.empty(samples) for p in policies}
        for i in range(samples):
            failed = random_failures(cluster, fraction, rng, blast)
            down = lost_domains(cluster, failed, blast)
            for p in policies:
                kept = replanner.throughput(failed, p, spares, fallback, batch, domains_down=down).throughput_relative
                losses[p][i] = 1 - kept
            if progress:
                progress()
        for p in policies:
            lo, hi = np.percentile(losses[p], [5, 95])
            rows.append(
                SweepRow(
                    policy=p,
                    fraction=fraction,
                    mean_loss=float(losses[p].mean()),
                    p5_loss=float(lo),
                    p95_loss=float(hi),
                )
            )
    return rows
