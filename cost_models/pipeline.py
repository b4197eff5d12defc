"""Pipeline schedule time: 1F1B and interleaved 1F1B.

Narayanan et al. SC'21, section 2.2: with p stages, m micro-batches and per-micro-batch stage
time t_f + t_b, 1F1B takes (m + p - 1)(t_f + t_b); interleaving v model chunks per stage cuts
the bubble to (p - 1)(t_f + t_b) / v. For stages of unequal time T_i (uneven layer counts,
embedding on the first stage, LM head on the last), the slowest stage S paces the steady state
and the others add their fill and drain: m T_S + (sum_i T_i - T_S) / v, which reduces to the
paper's formula when all T_i are equal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineTime:
    busy_s: float  # m micro-batches on the bottleneck stage
    bubble_s: float  # fill and drain
    bottleneck_stage: int

    @property
    def total_s(self) -> float:
        return self.busy_s + self.bubble_s


def pipeline_time(stage_time_s: list[float], num_micro_batches: int, vpp: int) -> PipelineTime:
    """Time of one step's forward and backward passes through the pipeline.

    >>> round(pipeline_time([1.0] * 4, 8, 1).total_s, 6)  # (m + p - 1) = 11
    11.0
    >>> round(pipeline_time([1.0] * 4, 8, 3).bubble_s, 6)  # (p - 1) / v = 1
    1.0
    """
    slowest = max(range(len(stage_time_s)), key=stage_time_s.__getitem__)
    t_max = stage_time_s[slowest]
    bubble = (sum(stage_time_s) - t_max) / vpp
    return PipelineTime(busy_s=num_micro_batches * t_max, bubble_s=bubble, bottleneck_stage=slowest)


def p2p_bytes(tokens: int, hidden: int, tp: int, act_bytes: int = 2) -> float:
    """Bytes one GPU sends to the next stage per micro-batch: the activation s b h, split over
    ``tp`` (the TP degree under sequence parallelism, else 1)."""
    return act_bytes * tokens * hidden / tp
