"""Collectives on real process groups: ``nproc`` local processes (spawned), every operation the
cost model prices on groups of every size from 2 to ``nproc`` (the first g ranks), over message
sizes from a kilobyte up.

Each size is timed the way nccl-tests does: a barrier, warm-up calls, then the median of timed
calls on rank 0 (CUDA events on GPUs). Bytes are counted as ``cost_models.collectives`` counts
them: all-reduce the buffer on each rank, all-gather the gathered size, reduce-scatter the full
input, all-to-all everything one rank sends, send/recv the message (timed as half a ping-pong).

Every wait has a deadline: the ranks' own collective timeout, and the parent, which polls the
processes and kills them all when one fails or the whole measurement runs past ``timeout_s``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cost_models.profile import CollectiveTime
from ntp_planner.executor.train.launch import supervised
from ntp_planner.profiler.timing import loop_time

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


class MeasureFailure(RuntimeError):
    """A measuring process failed or hung: the machine's fault or its setup's, not bad input."""


@dataclass(frozen=True)
class CollectiveSweep:
    """What to measure: on ``nproc`` processes over ``backend``, messages of ``sizes`` bytes."""

    nproc: int
    backend: str  # "gloo" or "nccl"
    device: str  # "cpu" or "cuda": where the messages live
    dtype: str  # torch dtype name of the messages
    sizes: tuple[int, ...]  # bytes, cost-model convention
    iters: int = 20  # back-to-back calls of a message up to 64 KiB per timed loop (fewer of larger ones)
    rounds: int = 3  # timed loops; the median of their means is recorded
    warmup: int = 2
    timeout_s: float = 600.0

    def tasks(self) -> list[tuple[str, int, int]]:
        """(op, group size, bytes) in the order rank 0 measures them; send/recv on pairs only."""
        return [
            (op, g, size)
            for g in range(2, self.nproc + 1)
            for op in OPS
            if op != "send_recv" or g == 2
            for size in self.sizes
        ]


def message_sizes(max_bytes: int, min_bytes: int = 1024, factor: int = 4) -> tuple[int, ...]:
    """Sizes from ``min_bytes`` by ``factor`` up to ``max_bytes`` (included).

    >>> message_sizes(64 * 1024)
    (1024, 4096, 16384, 65536)
    """
    out, size = [], min_bytes
    while size < max_bytes:
        out.append(size)
        size *= factor
    return (*out, max_bytes)


def measure_collectives(sweep: CollectiveSweep, tick: Callable[[str], None] | None = None) -> list[CollectiveTime]:
    """Every task of ``sweep`` timed on ``sweep.nproc`` spawned processes; MeasureFailure in one
    sentence when a process fails or the sweep runs past its deadline."""
    ctx = mp.get_context("spawn")
    done = ctx.Value("i", 0, lock=False)
    with tempfile.TemporaryDirectory(prefix="ntp-profile-") as tmp:
        procs = [ctx.Process(target=_worker, args=(r, sweep, tmp, done), daemon=True) for r in range(sweep.nproc)]
        with supervised(procs):
            _watch(procs, sweep, done, Path(tmp), tick)
        rows = json.loads(Path(tmp, "result.json").read_text())
    return [CollectiveTime(op=op, group_size=g, bytes=b, time_s=t) for op, g, b, t in rows]


def _watch(procs, sweep: CollectiveSweep, done, tmp: Path, tick) -> None:
    deadline, seen, tasks = time.monotonic() + sweep.timeout_s, 0, sweep.tasks()
    while any(p.exitcode is None for p in procs):
        for rank, p in enumerate(procs):
            if p.exitcode not in (None, 0):
                err = tmp / f"error-{rank}.txt"
                why = err.read_text() if err.exists() else f"exited with code {p.exitcode}"
                raise MeasureFailure(f"collective measurement rank {rank} failed: {why}")
        if time.monotonic() > deadline:
            raise MeasureFailure(
                f"the collective measurement ran past {sweep.timeout_s:g} s ({seen} of {len(tasks)} sizes done); "
                "measure smaller messages (--quick) or fewer processes"
            )
        while tick and seen < done.value:
            op, g, size = tasks[seen]
            tick(f"{op} g{g} {size} B")
            seen += 1
        time.sleep(0.02)
    if not (tmp / "result.json").exists():
        raise MeasureFailure("the collective measurement ended without results")


def _worker(rank: int, sweep: CollectiveSweep, tmp: str, done) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host; set in the child only
    try:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        if sweep.device == "cuda":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=sweep.timeout_s)
        init = f"file://{tmp}/store"
        dist.init_process_group(sweep.backend, init_method=init, rank=rank, world_size=sweep.nproc, timeout=timeout)
        groups = {g: dist.new_group(list(range(g))) for g in range(2, sweep.nproc + 1)}  # every rank, same order
        rows = []
        for op, g, size in sweep.tasks():
            if rank < g:
                nbytes, t = _time_op(op, size, groups[g], g, rank, device, getattr(torch, sweep.dtype), sweep)
                rows.append((op, g, nbytes, t))
            if rank == 0:
                done.value += 1
        dist.barrier()
        if rank == 0:
            Path(tmp, "result.json").write_text(json.dumps(rows))
        dist.destroy_process_group()
    except BaseException as exc:  # say why, then leave at once (no hanging in teardown)
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        Path(tmp, f"error-{rank}.txt").write_text(f"{type(exc).__name__}: {text}")
        os._exit(1)
    os._exit(0)


BURST_S = 1e-3  # compute between two timed collectives on a CPU: about a small block's share of a step


def _burst(device):
    """``BURST_S`` of small matrix products on one CPU thread (untimed), as a rank computes between
    its collectives in a step: on a shared host a collective after compute costs about twice one
    called back to back (the peer must be woken, and arrives late)."""
    a = torch.randn(64, 64, device=device)

    def run():
        end = time.perf_counter() + BURST_S
        while time.perf_counter() < end:
            a @ a

    return run


def _time_op(op: str, size: int, group, g: int, rank: int, device, dtype, sweep: CollectiveSweep):
    """(bytes as the cost model counts them, median seconds) of one operation on ``group``."""
    es = torch.tensor([], dtype=dtype).element_size()
    per = max(1, size // (es * g))  # elements each rank holds of a message cut g ways
    new = lambda n: torch.ones(n, device=device, dtype=dtype)  # noqa: E731
    if op == "all_reduce":
        t = new(max(1, size // es))
        call, nbytes = (lambda: dist.all_reduce(t, group=group)), t.numel() * es
    elif op == "all_gather":
        x, parts = new(per), [new(per) for _ in range(g)]
        call, nbytes = (lambda: dist.all_gather(parts, x, group=group)), per * g * es
    elif op == "reduce_scatter":
        out, chunks = new(per), [new(per) for _ in range(g)]
        call, nbytes = (lambda: dist.reduce_scatter(out, chunks, group=group)), per * g * es
    elif op == "all_to_all":
        x, y = new(per * g), new(per * g)
        call, nbytes = (lambda: dist.all_to_all_single(y, x, group=group)), per * g * es
    else:  # send_recv: rank 0 and rank 1 bounce the message; one way is half the round trip
        t, peer = new(max(1, size // es)), 1 - rank
        first, second = (dist.send, dist.recv) if rank == 0 else (dist.recv, dist.send)
        call, nbytes = (lambda: (first(t, peer), second(t, peer))), t.numel() * es
    sync = lambda: dist.barrier(group=group)  # noqa: E731
    iters = max(2, min(sweep.iters, sweep.iters * 2**16 // max(size, 1)))  # fewer of the large messages
    # on a CPU host a rank computes between its collectives and must be woken for each: time them so
    between = _burst(device) if device.type == "cpu" else None
    seconds = loop_time(call, device, iters, sweep.rounds, sweep.warmup, sync, between)
    return float(nbytes), seconds / 2 if op == "send_recv" else seconds
