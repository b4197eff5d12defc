"""Data-parallel synchronisation of one pipeline stage: what each ZeRO level moves, and how much
of it the schedule cannot hide.

Megatron-Core (``distributed/param_and_grad_buffer.py``, Megatron-FSDP's user guide): gradients
are reduced over dp x cp in buckets of max(40M, 1M x dp) parameters. With ``overlap_grad_reduce``
a bucket's reduction starts as soon as the last micro-batch's backward has produced all its
gradients, in a stream beside the remaining backward; the parameter all-gather of the
distributed optimizer is launched at the start of the next step and waited for bucket by bucket
by the first micro-batch's forward.

- ZeRO-0: one all-reduce of the gradients per step.
- ZeRO-1 (distributed optimizer): reduce-scatter of the gradients after the last micro-batch,
  all-gather of the updated parameters before the next step's first forward.
- ZeRO-2: gradients are reduce-scattered after every micro-batch's backward (no full gradient
  is kept), parameters gathered once per step.
- ZeRO-3 (FSDP): every layer's parameters are gathered before its forward and, unless kept
  (``reshard_after_forward=False``), again before its backward; gradients reduce-scattered per
  micro-batch. Each layer's traffic overlaps the neighbouring layers' compute.

Overlap model for a stream of b equal buckets, each ready at an even share of a compute window
W and taking c = C / b to move: the last one finishes max(c, C - W (1 - 1/b)) after the window
closes (the last bucket can never hide; when C > W the stream falls behind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MEGATRON_MIN_BUCKET_PARAMS = 40_000_000  # distributed_data_parallel.py: max(40M, 1M x dp)
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


@dataclass(frozen=True)
class DpTraffic:
    """Seconds of one stage's data-parallel collectives, each as if run alone."""

    reduce_s: float  # gradient reduce-scatter (all-reduce under ZeRO-0), once
    gather_s: float  # parameter all-gather, once
    buckets: int  # how many pieces each is cut into (buckets, or FSDP units under ZeRO-3)


def bucket_count(params_per_gpu: float, dp: int, zero: int, layers: int) -> int:
    """Buckets of one stage's gradients (Megatron's default size), or its layers under ZeRO-3,
    where the unit of gathering is one transformer layer."""
    if zero >= 3:
        return max(1, layers)
    size = max(MEGATRON_MIN_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * dp)
    return max(1, math.ceil(params_per_gpu / size))


def tail(comm_s: float, window_s: float, buckets: int) -> float:
    """Time a bucketed stream of ``comm_s`` runs past a compute window of ``window_s``.

    >>> tail(1.0, 10.0, 4), tail(10.0, 4.0, 4)
    (0.25, 7.0)
    """
    if comm_s <= 0:
        return 0.0
    return max(comm_s / buckets, comm_s - window_s * (1 - 1 / buckets))


def exposed_dp_time(
    traffic: DpTraffic,
    zero: int,
    overlap: bool,
    reshard_after_forward: bool,
    fwd_s: float,
    bwd_s: float,
    micro_batches: int,
    grad_window_s: float,
    gather_window_s: float,
    pieces: int,
) -> tuple[float, float]:
    """(gradient reduction, parameter gathering) time on the critical path of one stage.

    ``fwd_s`` and ``bwd_s`` are one micro-batch's forward and backward (recompute included);
    ``grad_window_s`` is the compute during which the once-per-step gradient reduction can run
    (the last micro-batch's backward, or more for a stage the drain reaches late; under
    interleaving the cool-down, as each model chunk's gradients complete in turn),
    ``gather_window_s`` the compute before the gathered parameters are needed, and ``pieces``
    how many independently launched pieces each is cut into."""
    red, gat, b, m = traffic.reduce_s, traffic.gather_s, traffic.buckets, micro_batches
    if not overlap:
        if zero >= 3:
            return m * red, m * gat * (1 + reshard_after_forward)
        return red * (m if zero == 2 else 1), gat
    if zero <= 1:
        return tail(red, grad_window_s, pieces), tail(gat, gather_window_s, pieces)
    if zero == 2:  # a reduce-scatter per micro-batch, hidden behind that micro-batch's compute
        steady = (m - 1) * max(0.0, red - (fwd_s + bwd_s))
        return steady + tail(red, grad_window_s, pieces), tail(gat, gather_window_s, pieces)
    backward = red + (gat if reshard_after_forward else 0.0)
    return m * tail(backward, bwd_s, b), m * tail(gat, fwd_s, b)
