"""Where each rank's step time and memory go, measured inside the run (issue 13, validate).

Time: ``Comm`` adds the wall time spent inside every collective to its category ("tp", "cp",
"pp", "dp", "ep"; waiting for peers included, so a pipeline bubble shows up as "pp" wait); ``StepClock``
takes each step's difference and times ``opt.zero_grad()`` + ``opt.step()`` as "optimizer".
Compute is the rest: step time minus all of these.

Memory, by tensor accounting (exact on CPU): the bytes of the parameters a rank holds, of their
``.grad``, of AdamW's ``exp_avg`` and ``exp_avg_sq`` (its per-tensor ``step`` counters, 4 bytes
each, are not counted: the cost model has none, and on GPU they live on the host), and the
activations saved for backward that are alive at once (``ActivationMeter``). Under ZeRO or bf16
the sharded optimizer counts what it holds (``optimizer.ShardedOptimizer.held_bytes``); under
ZeRO-3 the gathered parameters saved for backward count as activations. On CUDA, also
``torch.cuda.max_memory_allocated`` over the steady steps.

At the end of the run every rank puts its numbers in its row of one float64 matrix that one
``world_reduce`` sums onto every rank (``gather_rows``, outside the timed steps); ``summarize``
turns rank 0's copy into the ``Result`` fields.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from ntp_planner.executor.parallel.comm import KINDS, Comm
from ntp_planner.executor.spec import RunSpec

SPLIT = ("compute", "tp_comm", "cp_comm", "pp_wait", "dp_sync", "optimizer", "ep_comm")  # keys of a time split
PART = {"tp": "tp_comm", "cp": "cp_comm", "pp": "pp_wait", "dp": "dp_sync", "ep": "ep_comm"}  # Comm category -> key
MEMORY = ("weights", "grads", "optimizer", "activations_peak", "cuda_max_allocated")  # keys of memory_bytes
TIMED = ("step", *KINDS, "optimizer")  # one step's row in StepClock.rows


class StepClock:
    """One rank's step times (``rows``: per step, seconds of the step, of each Comm category and
    of the optimizer, in ``TIMED`` order)."""

    def __init__(self, comm: Comm):
        self.comm = comm
        self.rows: list[list[float]] = []

    def start(self) -> None:
        self._start, self._comm = time.perf_counter(), dict(self.comm.spent_s)
        self._optimizer_s = self._excluded_s = 0.0

    @contextmanager
    def optimizer(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self._optimizer_s += time.perf_counter() - start

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Work inside a step that is not training (the first step's gradients gathered for the
        comparison): its time leaves the step."""
        start = time.perf_counter()
        yield
        self._excluded_s += time.perf_counter() - start

    def stop(self) -> None:
        step_s = time.perf_counter() - self._start - self._excluded_s
        comm = [self.comm.spent_s[k] - self._comm[k] for k in KINDS]
        self.rows.append([step_s, *comm, self._optimizer_s])


class _Saved:
    """A tensor saved for backward, as autograd holds it while the meter watches; when autograd
    drops it (the graph is released), it tells the meter (``__del__``: cheaper than a
    ``weakref.finalize`` per saved tensor)."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor: torch.Tensor, meter: ActivationMeter, key: int):
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self):
        self.meter._release(self.key)


class ActivationMeter:
    """Bytes saved for backward that are alive at once, and their peak.

    Under ``hooks()`` every tensor autograd saves is packed into a handle: the first handle on an
    underlying storage adds the storage's bytes (views of one storage count once), and when the
    graph that saved it is released (after its backward) the last handle takes them off.
    Storages of ``exclude`` (parameters, the input batch) are not activations and are skipped.
    Not counted: the stage output a pipeline keeps for its backward (alive, but saved by no op),
    and under full recompute the layer inputs the checkpoint keeps to recompute from and the
    recomputation's transient saves (the checkpoint holds them, under its own hooks): then only
    the blocks outside the checkpoints (embedding, LM head) count. Under selective recompute the
    core attention's inputs count (the checkpoint saves them) and its own saves do not.

    >>> meter = ActivationMeter([])
    >>> w = torch.ones(4, requires_grad=True)
    >>> with meter.hooks():
    ...     y = (w * w).sum()  # mul saves both operands: one storage of 4 floats, counted once
    >>> meter.current_bytes, meter.peak_bytes
    (16, 16)
    >>> y.backward()
    >>> meter.current_bytes, meter.peak_bytes
    (0, 16)
    """

    def __init__(self, exclude: Iterable[torch.Tensor]):
        self._skip = {t.untyped_storage().data_ptr() for t in exclude}
        self._live: dict[int, list[int]] = {}  # storage address -> [bytes, live handles]
        self.current_bytes = 0
        self.peak_bytes = 0

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def reset_peak(self) -> None:
        self.peak_bytes = self.current_bytes

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._skip or storage.nbytes() == 0:
            return t
        entry = self._live.get(key)
        if entry is None:  # the handle keeps the storage alive, so its address stays unique
            entry = self._live[key] = [storage.nbytes(), 0]
            self.current_bytes += entry[0]
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        entry[1] += 1
        return _Saved(t, self, key)

    @staticmethod
    def _unpack(saved) -> torch.Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _release(self, key: int) -> None:
        entry = self._live[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self._live[key]
            self.current_bytes -= entry[0]


def _nbytes(tensors: Iterable[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def rank_memory(params: list[torch.Tensor], opt, meter: ActivationMeter, device, sharded=None) -> list[float]:
    """This rank's bytes in ``MEMORY`` order (cuda_max_allocated -1 off CUDA), after a step.
    ``sharded`` (an ``optimizer.ShardedOptimizer``) counts what it holds: 1/n of the optimizer
    state under ZeRO-1, of the gradients too under ZeRO-2, of the weights too under ZeRO-3, fp32
    master weights (optimizer) and gradient buffers (grads) under mixed precision."""
    cuda = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else -1
    if sharded is not None:
        return [*sharded.held_bytes(), meter.peak_bytes, cuda]
    moments = [s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq") if k in s]
    return [_nbytes(params), _nbytes(p.grad for p in params), _nbytes(moments), meter.peak_bytes, cuda]


def gather_rows(comm: Comm, row: list[float], rank: int, world: int, device) -> torch.Tensor:
    """Every rank's ``row`` (equal lengths) as a [world, len] float64 matrix, on every rank."""
    rows = torch.zeros(world, len(row), dtype=torch.float64, device=device)
    rows[rank] = torch.tensor(row, dtype=torch.float64, device=device)
    return comm.world_reduce(rows).cpu()


def _split(rows: list[list[float]]) -> dict[str, float]:
    """Mean over ``rows`` (TIMED order) as a split; compute = step - the rest."""
    mean = [sum(col) / len(col) for col in zip(*rows, strict=True)]
    parts = {PART[k]: v for k, v in zip(KINDS, mean[1 : 1 + len(KINDS)], strict=True)}
    parts["optimizer"] = mean[-1]
    return {"compute": mean[0] - sum(parts.values()), **{k: parts[k] for k in SPLIT[1:]}}


def summarize(spec: RunSpec, stats: torch.Tensor) -> dict:
    """The ``Result`` fields from the gathered matrix (a row per rank: ``spec.steps`` rows of
    ``TIMED``, then ``MEMORY``). A stage's numbers are those of its slowest rank, over every
    replica: the one with the largest mean steady step time (steps after the first)."""
    width = len(TIMED)
    per_rank = [[r[i * width : (i + 1) * width] for i in range(spec.steps)] for r in stats.tolist()]
    steady = [rows[1:] or rows for rows in per_rank]
    mean_s = [sum(r[0] for r in rows) / len(rows) for rows in steady]
    slowest_per_step = [max(col) for col in zip(*([r[0] for r in rows] for rows in steady), strict=True)]
    memory = [dict(zip(MEMORY, (int(v) for v in r[spec.steps * width :]), strict=True)) for r in stats.tolist()]
    for m in memory:
        if m["cuda_max_allocated"] < 0:
            del m["cuda_max_allocated"]
    stage_ranks = [[] for _ in range(spec.pp)]
    for rank in range(spec.world_size):
        stage_ranks[spec.locate(rank)[1]].append(rank)
    slowest = [max(ranks, key=lambda r: mean_s[r]) for ranks in stage_ranks]
    run_slowest = max(range(spec.world_size), key=lambda r: mean_s[r])
    return {
        "step_time_s": sum(slowest_per_step) / len(slowest_per_step),
        "step_time_median_s": statistics.median(slowest_per_step),
        "rank_step_times_s": [[r[0] for r in rows] for rows in per_rank],
        "stage_step_time_s": [mean_s[r] for r in slowest],
        "stage_time_split_s": [_split(steady[r]) for r in slowest],
        "time_split_s": _split(steady[run_slowest]),
        "memory_bytes": memory,
        "stage_memory_bytes": [{k: max(memory[r][k] for r in ranks) for k in memory[0]} for ranks in stage_ranks],
    }
