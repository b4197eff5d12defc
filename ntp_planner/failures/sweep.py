"""Throughput loss over random failure placements: mean, p5 and p95 per policy and fraction.

Every sample draws one failure set (seeded) and evaluates every policy on that same set, so the
policies are compared on identical failures.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict

from ntp_planner.failures.replan import POLICIES, BatchMode, Replanner
from ntp_planner.failures.sampling import Blast, lost_domains, random_failures
from ntp_planner.plan import Plan


class SweepRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str
    fraction: float
    mean_loss: float
    p5_loss: float
    p95_loss: float


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


def plot_sweep(rows: list[SweepRow], path, title: str) -> None:
    """Mean loss per policy against the failed fraction, with the p5-p95 band (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib; install the extra: pip install 'ntp-planner[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for policy in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == policy]
        x = [100 * r.fraction for r in mine]
        ax.plot(x, [100 * r.mean_loss for r in mine], marker="o", label=policy)
        ax.fill_between(x, [100 * r.p5_loss for r in mine], [100 * r.p95_loss for r in mine], alpha=0.2)
    ax.set_xlabel("GPUs failed (%)")
    ax.set_ylabel("throughput loss (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
