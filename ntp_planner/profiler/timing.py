"""The timers every measurement uses.

``median_time`` (kernels and blocks): warm-up runs, then the median of timed repetitions. On CUDA
a repetition is bracketed by CUDA events and the device synchronised (kernel launches are
asynchronous, a host clock would time the launch); on CPU ``time.perf_counter`` brackets the
call. The median, not the mean, so one preempted repetition does not move the figure.

``loop_time`` (collectives), as nccl-tests times them: after a barrier, a loop of back-to-back
calls timed as a whole and divided by its length; the median over a few such loops. A step pays
the mean cost of its many collectives, tail included (on a shared CPU host the mean all-reduce is
two to three times the median one), and back-to-back calls keep the barrier out of the figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch


def median_time(
    run: Callable[[Any], Any],
    device: torch.device,
    reps: int,
    warmup: int = 1,
    before: Callable[[], Any] | None = None,
) -> float:
    """Median seconds of ``run(before())`` over ``reps`` timed calls after ``warmup`` untimed ones.
    ``before`` (untimed) prepares each call's input, e.g. a fresh forward whose backward is timed."""
    prepare = before or (lambda: None)
    for _ in range(warmup):
        run(prepare())
    times = []
    for _ in range(reps):
        arg = prepare()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(arg)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)  # ms -> s
        else:
            t0 = time.perf_counter()
            run(arg)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def loop_time(
    call: Callable[[], Any],
    device: torch.device,
    iters: int,
    rounds: int,
    warmup: int,
    sync: Callable[[], Any],
    between: Callable[[], Any] | None = None,
) -> float:
    """Median over ``rounds`` of the mean seconds of ``iters`` ``call()``s, each round started by
    ``sync()`` (a barrier) after ``warmup`` untimed calls. Without ``between`` the calls run back
    to back and the loop is timed whole; with it, ``between()`` (untimed: a burst of compute, as a
    training step has between its collectives) runs before each call and only the calls count."""
    for _ in range(warmup):
        call()
    means = []
    for _ in range(rounds):
        sync()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if between is None:
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            means.append((time.perf_counter() - t0) / iters)
            continue
        spent = 0.0
        for _ in range(iters):
            between()
            t0 = time.perf_counter()
            call()
            spent += time.perf_counter() - t0
        means.append(spent / iters)
    return statistics.median(means)


@contextmanager
def threads(n: int | None):
    """torch's intra-op threads set to ``n`` inside the block (None: left as they are), restored after."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
