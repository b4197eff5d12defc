"""Launch a run's ranks on this host, watch them, and compare the result with one process.

Every rank is a ``torch.multiprocessing`` spawn process. The launcher never waits without a
deadline: a rank that exits with an error or dies ends the run at once, and when no rank has
entered a collective for ``timeout_s`` the run is declared hung; the failure names the rank.
The ranks' own collective timeout is longer, so the launcher, which sees them all, decides.
Each rank reports the step it has entered and the collectives it has entered and left (a shared
array): a hung rank is outside any collective while the ranks waiting for it are inside one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ntp_planner.executor.check.holders import compare, loss_errors, non_finite_losses
from ntp_planner.executor.check.measure import summarize
from ntp_planner.executor.model.batch import missing_ids
from ntp_planner.executor.model.reference import zero_gradient_params
from ntp_planner.executor.parallel.comm import lost_peer, raise_terminated
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.processes import context
from ntp_planner.executor.train.runtime import reference_run, run_rank

STARTUP_S = 60.0  # extra patience before every rank has entered its first collective


class RankFailure(RuntimeError):
    """A rank died, raised or hung; the message names it. ``report``: whether this process is
    the one to say it (under torchrun every failing rank raises one; one of them reports)."""

    report = True


@dataclass
class Result:
    """A run's comparison with the reference and its measurements (``measure``). Steady = the
    steps after the first. A split is a dict of seconds over ``measure.SPLIT``: compute, tp_comm,
    cp_comm, pp_wait (waiting for the neighbouring stages: the bubble), dp_sync, optimizer;
    compute is the step time minus the rest, so the parts add up to the step time. A stage is a
    pipeline stage index over every replica; its numbers are those of its slowest rank (largest
    mean steady step time). Memory dicts are bytes over ``measure.MEMORY`` (cuda_max_allocated
    only on CUDA); activations_peak is the peak over the steady steps of the bytes saved for
    backward alive at once. ``step_time_s`` and ``step_time_median_s`` take the slowest rank of
    each step, so they are at least ``sum(time_split_s.values())`` (the slowest rank's mean)."""

    losses: list[float]
    reference_losses: list[float]
    max_rel_error_loss: float
    max_rel_error_params: float  # max over every holder of every tensor of |got - ref| / |ref| (``holders``)
    max_rel_error_grads: float  # the same for the first step's synced gradients (Adam hides scale errors)
    step_time_s: float  # slowest rank, mean over the steps after the first
    wall_s: float
    worst_param: str = ""
    max_elementwise_error_params: float = 0.0  # max over holders of max|got - ref| / max|ref|
    per_replica_error: list[float] = field(default_factory=list)  # per pipeline (replica, or its cp slice)
    step_time_median_s: float = 0.0  # slowest rank, median over the steady steps (robust to noise)
    rank_step_times_s: list[list[float]] = field(default_factory=list)  # [rank][step], every step
    stage_step_time_s: list[float] = field(default_factory=list)  # [stage]: mean steady step time
    stage_time_split_s: list[dict[str, float]] = field(default_factory=list)  # [stage]: mean steady split
    time_split_s: dict[str, float] = field(default_factory=dict)  # the run's slowest rank: mean steady split
    memory_bytes: list[dict[str, int]] = field(default_factory=list)  # [rank]
    stage_memory_bytes: list[dict[str, int]] = field(default_factory=list)  # [stage]: max over its ranks
    worst_param_holder: str = ""  # where the worst parameter is held: rank (replica, stage, copy, TP rank)
    worst_grad: str = ""  # the parameter whose first-step gradient is worst
    worst_grad_holder: str = ""  # where that gradient is held
    holdings_compared: int = 0  # (rank, parameter) pairs compared with the reference
    vocab_ids_missing: int = 0  # vocabulary ids that the batch lacks as an input or as a target (``batch``)
    # what fails the run whatever the errors say, a sentence each: a value that is not finite (and
    # where), a live run's sample log that is not the stream's, a process that died of its own error
    problems: list[str] = field(default_factory=list)


def error_line(exc: BaseException) -> str:
    """'ValueError: the first line of its message (file.py:123)': a rank's error, said in one line."""
    last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" ({Path(last.filename).name}:{last.lineno})" if last else ""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}{where}"


def _worker(rank, spec, init_method, backend, out_file, err_dir, timeout_s, progress, fault, worker_init) -> None:
    # gloo on loopback: every rank of a local run is on this host (set in the child, so the
    # caller's environment stays as it was)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if worker_init is not None:  # the caller's hook (a test's planted bug: ``tests/support/mutations``)
        worker_init()
    try:
        run_rank(rank, spec, init_method, backend, out_file, timeout_s, progress, fault)
    except BaseException as exc:  # report why, then leave at once (no hanging in teardown)
        report = {"collective": lost_peer(exc), "error": error_line(exc)}
        Path(err_dir, f"{rank}.json").write_text(json.dumps(report))
        os._exit(1)
    os._exit(0)


def describe_rank(spec: RunSpec, rank: int) -> str:
    pipeline, s = spec.locate(rank)
    local = spec.replicas[pipeline].stages[s].ranks.index(rank)
    cp = f", cp rank {spec.replicas[pipeline].cp_rank}" if spec.cp > 1 else ""
    return f"rank {rank} (replica {pipeline // spec.cp}{cp}, stage {s}, local rank {local})"


def launch(
    spec: RunSpec, backend: str = "gloo", timeout_s: float = 120.0, fault=None, tick=None, worker_init=None
) -> Result:
    """Run ``spec`` on ``spec.world_size`` local processes and compare with the reference.
    Raises RankFailure naming the rank when one fails or hangs. ``tick(step)`` hears the step
    the slowest rank has entered. ``worker_init()``, a picklable callable, runs in every rank
    before it trains: ranks fork from a server started earlier, so whatever the caller set up in
    its own process (a test's monkeypatch) never reaches them otherwise."""
    start = time.perf_counter()
    ctx = context()
    world = spec.world_size
    progress = ctx.Array("q", 3 * world, lock=False)
    with tempfile.TemporaryDirectory(prefix="ntp-validate-") as tmp:
        out, errs = Path(tmp, "out.pt"), Path(tmp, "errors")
        errs.mkdir()
        init = f"file://{tmp}/store"
        args = (spec, init, backend, str(out), str(errs), 2 * timeout_s + STARTUP_S, progress, fault, worker_init)
        procs = [ctx.Process(target=_worker, args=(r, *args), daemon=True) for r in range(world)]
        with supervised(procs):
            _watch(spec, procs, progress, errs, timeout_s, tick)
        got = torch.load(out)
    ref = reference_run(spec, device="cuda" if backend == "nccl" else "cpu")  # a full-size model's is a GPU's work
    return _compare(spec, got, ref, time.perf_counter() - start)


@contextmanager
def supervised(procs: list):
    """Start ``procs``; on leaving, however it is left, kill those still alive and reap them all
    (at most 5 s each), so no process outlives the caller's wait."""
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)


def under_torchrun() -> bool:
    """True in a process that torchrun (or another launcher setting RANK and WORLD_SIZE) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run_as_torchrun_rank(spec: RunSpec, backend: str = "gloo", timeout_s: float = 120.0, fault=None) -> Result | None:
    """Be rank $RANK of a run that torchrun launched (across hosts): the same training as
    ``launch`` (``fault`` as there); rank 0 compares with the reference and returns the result,
    the others None. torchrun watches the processes; the collective timeout ends a run whose
    peer is gone. A failed run raises one RankFailure naming the rank that failed
    (``torchrun_failure``); only one rank's has ``report`` set, so the run says it once."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != spec.world_size:
        raise ValueError(f"torchrun started {world} processes but the run needs {spec.world_size}")
    start = time.perf_counter()
    store = _agent_store(timeout_s)
    if store is not None:
        store.set(_key(f"pid/{rank}"), json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    with tempfile.TemporaryDirectory(prefix="ntp-validate-") as tmp:
        out = Path(tmp, "out.pt")
        stopping = _SigtermAsLostPeer()
        try:
            run_rank(rank, spec, "env://", backend, str(out), timeout_s, _StoreSteps(store, rank), fault)
        except Exception as exc:  # a lost peer or this rank's own error: one line, said by one rank
            stopping.reporting = True  # a plain store first, before any call can take the signal
            raise torchrun_failure(spec, rank, exc, store) from None
        finally:
            stopping.restore()
        if rank != 0:
            return None
        got = torch.load(out)
    return _compare(spec, got, reference_run(spec), time.perf_counter() - start)


# Under torchrun the ranks tell each other, through the agent's store (it outlives any rank), which
# step each has entered, their process ids and, when they fail, why; keys under this prefix.
def _key(name: str) -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    return f"ntp-validate/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}"


class _SigtermAsLostPeer:
    """Take torchrun's SIGTERM as a lost peer while the rank trains. The agent sends it to every
    worker 0.1 s after one fails, and kills them 30 s later: a rank already saying why the run
    failed (``reporting`` set) finishes saying it. ``restore`` puts the old handler back on
    success only: a failed rank keeps ignoring SIGTERM until it has spoken and exited."""

    def __init__(self) -> None:
        self.reporting = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        if not self.reporting:
            raise_terminated(signum, frame)

    def restore(self) -> None:
        if self.previous is not None and not self.reporting:
            signal.signal(signal.SIGTERM, self.previous)


def _agent_store(timeout_s: float):
    """A client of torchrun's agent store, or None when the store is rank 0's (a launcher that
    is not torchrun's elastic agent): it would die with rank 0, so it cannot carry reports."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    try:
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        return dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=min(timeout_s, 30.0)))
    except (RuntimeError, ValueError, KeyError):  # no agent store after all: each rank speaks for itself
        return None


class _StoreSteps:
    """``run_rank``'s progress for a torchrun rank: only the step it has entered (slot 3 rank),
    into the agent store; the per-collective counts a local launcher watches are not sent."""

    def __init__(self, store, rank: int):
        self.store, self.rank = store, rank

    def __setitem__(self, i: int, value: int) -> None:
        if self.store is not None and i == 3 * self.rank:
            self.store.set(_key(f"step/{self.rank}"), str(value))

    def __getitem__(self, i: int) -> int:
        return 0


def _gone(info: dict) -> bool:
    """Whether the process in ``info`` (host, pid) is known to have ended: on this host, its pid
    is gone or a zombie. A process on another host cannot be looked at: not known gone."""
    if info["host"] != socket.gethostname():
        return False
    try:
        state = Path(f"/proc/{info['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _during(spec: RunSpec, ranks: list[int], steps: dict) -> str:
    """'rank 5 (replica 1, stage 0, local rank 1, in step 2)': ranks and the step each entered."""
    return " and ".join(f"{describe_rank(spec, r)[:-1]}, in step {steps.get(r, '?')})" for r in ranks)


REPORT_GRACE_S = 2.0  # how long a rank that lost a peer looks for the rank that failed


def torchrun_failure(spec: RunSpec, rank: int, exc: BaseException, store) -> RankFailure:
    """The failure of a torchrun run, said once: a rank's own error names that rank; a rank that
    lost a peer names the ranks that are gone (their processes ended, on this host) or that said
    why they failed, and what step each had entered. The first rank to claim the report says it
    (``report``); the others stay quiet, so ``--json`` prints one object."""
    mine = describe_rank(spec, rank)
    if not lost_peer(exc):
        sentence = f"{mine} failed: {error_line(exc)}"
    else:
        sentence = f"{mine} lost contact with a peer ({error_line(exc)})"
    failure = RankFailure(sentence)
    failure.report = True
    if store is None:
        return failure
    try:
        store.set(_key(f"report/{rank}"), json.dumps({"collective": lost_peer(exc), "error": error_line(exc)}))
        if lost_peer(exc):
            failure = RankFailure(_blame(spec, rank, store) or sentence)
        failure.report = store.compare_set(_key("reporter"), "", str(rank)).decode() == str(rank)
    except (RuntimeError, ValueError):  # the store went away: say what this rank saw
        failure.report = True
    return failure


def _blame(spec: RunSpec, rank: int, store) -> str:
    """Who failed, as a rank that lost a peer finds out: a rank that reported its own error, else
    the ranks whose processes are gone; '' when neither shows within REPORT_GRACE_S."""
    world = spec.world_size
    deadline = time.monotonic() + REPORT_GRACE_S
    while True:
        reports = {r: json.loads(store.get(_key(f"report/{r}"))) for r in range(world)
                   if store.check([_key(f"report/{r}")])}  # fmt: skip
        steps = {r: store.get(_key(f"step/{r}")).decode() for r in range(world) if store.check([_key(f"step/{r}")])}
        own = [r for r, rep in reports.items() if not rep["collective"]]
        if own:
            r = own[0]
            return f"{describe_rank(spec, r)} failed during step {steps.get(r, '?')}: {reports[r]['error']}"
        pids = {r: json.loads(store.get(_key(f"pid/{r}"))) for r in range(world) if store.check([_key(f"pid/{r}")])}
        gone = [r for r in range(world) if r != rank and r not in reports and r in pids and _gone(pids[r])]
        if gone:
            return f"{_during(spec, gone, steps)} died without a word; the other ranks lost contact and stopped"
        if time.monotonic() > deadline:
            silent = [r for r in range(world) if r not in reports]
            if not silent:
                return ""
            return f"{_during(spec, silent, steps)} stopped responding; the other ranks lost contact and stopped"
        time.sleep(0.05)


def _watch(spec, procs, progress, errs: Path, timeout_s: float, tick) -> None:
    """Wait for the ranks; fail when one exits with an error or when no rank has entered a
    collective for ``timeout_s`` (plus STARTUP_S before every rank has entered its first)."""
    world = len(procs)
    seen = [-1] * world
    changed = [time.monotonic()] * world
    while True:
        if tick is not None:
            tick(min(progress[3 * r] for r in range(world)))
        codes = [p.exitcode for p in procs]
        if all(c == 0 for c in codes):
            return
        now = time.monotonic()
        for r in range(world):
            if progress[3 * r + 1] != seen[r]:
                seen[r], changed[r] = progress[3 * r + 1], now
        if any(c not in (None, 0) for c in codes):
            time.sleep(0.5)  # let the others report what they saw
            raise RankFailure(_diagnose(spec, [p.exitcode for p in procs], progress, errs))
        started = all(seen[r] > 0 for r in range(world))
        if now - max(changed) > timeout_s + (0 if started else STARTUP_S):
            raise RankFailure(_diagnose(spec, codes, progress, errs, timeout_s))
        time.sleep(0.05)


def _diagnose(spec, codes, progress, errs: Path, timeout_s: float | None = None) -> str:
    world = len(codes)
    reports = {
        r: json.loads(Path(errs, f"{r}.json").read_text()) for r in range(world) if Path(errs, f"{r}.json").exists()
    }
    step = {r: progress[3 * r] for r in range(world)}
    for r, c in enumerate(codes):  # died without a word
        if c not in (None, 0, 1) or (c == 1 and r not in reports):
            how = f"was killed by signal {-c}" if c < 0 else f"exited with code {c}"
            return f"{describe_rank(spec, r)} died: it {how} during step {step[r]}; the other ranks were stopped."
    for r, rep in reports.items():  # its own error, not a collective that lost a peer
        if not rep["collective"]:
            return f"{describe_rank(spec, r)} failed during step {step[r]}: {rep['error']}"
    stuck = [r for r in range(world) if codes[r] != 0]
    # the others wait inside a collective (entered > left); the culprit is outside any
    outside = [r for r in stuck if codes[r] is None and progress[3 * r + 1] == progress[3 * r + 2]]
    culprits = outside if outside and len(outside) < len(stuck) else stuck
    names = ", ".join(describe_rank(spec, r) for r in culprits)
    if timeout_s is None:
        return f"{names} lost contact with the other ranks during step {step[culprits[0]]}."
    if culprits is stuck:
        return f"{names} made no progress for {timeout_s:g} s; allow a longer timeout if the run is just slow."
    return (
        f"{names} hung: no rank made progress for {timeout_s:g} s; it stopped during step {step[culprits[0]]} "
        f"outside any collective while the other ranks waited for it in one."
    )


def _compare(spec: RunSpec, got: dict, ref: dict, wall_s: float) -> Result:
    losses, ref_losses = got["losses"], ref["losses"]
    # a parameter with no gradient in exact arithmetic (``model.zero_gradient_params``) cannot
    # change the loss; AdamW turns its rounding-noise gradient into steps of about lr, different
    # in every run, so its values are not compared and its gradient is on the scale of the rest
    zero = zero_gradient_params(spec.cfg)
    noise = frozenset(k for k in ref["grads"] if k.rsplit(".", 1)[-1] in zero)
    held = compare(got["holders"], ref["params"], ref["grads"], noise)
    held["problems"] = non_finite_losses(losses, ref_losses) + held["problems"]
    return Result(
        losses=losses,
        reference_losses=ref_losses,
        max_rel_error_loss=loss_errors(losses, ref_losses),
        wall_s=wall_s,
        vocab_ids_missing=len(set().union(*missing_ids(spec))),
        **held,
        **summarize(spec, got["rank_stats"]),
    )
