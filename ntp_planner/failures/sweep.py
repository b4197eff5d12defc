"""Throughput loss over random failure placements: mean, p5 and p95 per policy and fraction.

Every sample draws one failure set (seeded) and evaluates every policy on that same set, so the
policies are compared on identical failures.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ntp_planner.failures.replan import POLICIES, BatchMode, Replanner
from ntp_planner.failures.sampling import Blast, lost_domains, random_failures
from ntp_planner.plan import Plan
from ntp_planner.plots import plot_sweep  # noqa: F401  (re-export: the CLI imports it from here)


class SweepRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str = Field(description="Re-planning policy.")
    fraction: float = Field(description="Share of blast units failed.")
    mean_loss: float = Field(description="Mean throughput loss (1 - relative throughput) over samples.")
    p5_loss: float = Field(description="5th percentile of the loss.")
    p95_loss: float = Field(description="95th percentile of the loss.")


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
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    if samples < 1:
        raise ValueError(f"--samples {samples} must be at least 1")
    replanner = Replanner(plan, max_power)
    cluster = plan.cluster.build()
    rows = []
    for fraction in fractions:
        losses = {p: np.empty(samples) for p in policies}
        for i in range(samples):
            failed = random_failures(cluster, fraction, rng, blast)
            down = lost_domains(cluster, failed, blast)
            for p in policies:
                kept = replanner.replan(failed, p, spares, fallback, batch, detail=False, domains_down=down)
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
