"""The answer of ``ntp capacity``: among the simulated candidates that meet the deadline
(P(time to train <= deadline) >= confidence), the time/cost front, time = the time to train at the
confidence (its quantile), cost = the mean cost; the cheapest is the front's first (ties: the
faster, then the earlier in the grid). Every other candidate gets the reason it lost, in a
sentence (those pruned before simulating already have theirs, ``capacity.search``).
"""

from __future__ import annotations

import math

from ntp_planner.failures.capacity_spec import Candidate, CapacityResult, CapacitySpec


def usd(x: float) -> str:
    """Dollars, rounded to what a budget reads; a mean over trials one of which never finished
    (by its horizon's cap) is unbounded.

    >>> usd(106_772_035.2), usd(14_515.0), usd(12.5), usd(math.inf)
    ('$106.8M', '$14.5k', '$12', 'unbounded')
    """
    if math.isinf(x):
        return "unbounded"
    return f"${x / 1e6:,.1f}M" if x >= 1e6 else f"${x / 1e3:,.1f}k" if x >= 1e3 else f"${x:,.0f}"


def rank(spec: CapacitySpec, done: list[Candidate], simulated: int) -> CapacityResult:
    """Front and cheapest among the simulated candidates that meet the deadline (``done``: every
    candidate in grid order); a reason for every other candidate."""
    meets = [i for i, c in enumerate(done) if not c.reason and c.p_deadline >= spec.confidence]
    meets.sort(key=lambda i: (done[i].cost_usd, done[i].days_at_confidence, i))
    front: list[int] = []
    for i in meets:
        if not front or done[i].days_at_confidence < done[front[-1]].days_at_confidence:
            front.append(i)
    out = list(done)
    for i, c in enumerate(done):
        if i in front:
            out[i] = c.model_copy(update={"verdict": "cheapest" if i == front[0] else "front"})
        elif not c.reason:
            out[i] = c.model_copy(update={"reason": _why_lost(spec, c, [done[j] for j in front])})
    fronts = [out[i] for i in front]
    return CapacityResult(candidates=out, cheapest=fronts[0] if fronts else None, front=fronts, simulated=simulated)


def _why_lost(spec: CapacitySpec, c: Candidate, front: list[Candidate]) -> str:
    """Why a simulated candidate off the front lost: too slow at the confidence, else the first
    candidate of the front (by cost) at least as cheap and as fast."""
    if c.p_deadline < spec.confidence:
        return (
            f"too slow at that confidence: done by day {spec.deadline_days:g} in "
            f"{100 * c.p_deadline:.0f}% of trials, under {100 * spec.confidence:g}%"
        )
    by = next(f for f in front if f.cost_usd <= c.cost_usd and f.days_at_confidence <= c.days_at_confidence)
    return f"dominated by {by.label}: {by.days_at_confidence:.1f} days, {usd(by.cost_usd)}"
