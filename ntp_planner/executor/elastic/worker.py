"""Live recovery, one process's side: train in generations, leave one when a peer fails, carry
the committed state into the next.

A process lives through generations (``coordinator`` publishes each one in the run's store, ``membership``):
in generation ``n`` it is rank ``procs.index(proc)`` of the generation's RunSpec, or idle. Each
generation has its own process group (``PrefixStore`` "g<n>/pg/"), built from scratch; the old one
is destroyed first, which also wakes any peer still blocked in one of its collectives (gloo then
fails that peer's call at once instead of at the timeout).

Commit protocol, per step and all in the store, so that no update is lost or applied twice: after
the gradient sync each rank adds its vote (its loss share first); the rank whose vote completes
the count writes the step's decision "commit" with a compare-and-set. A rank that sees the
generation aborted writes "abort" with the same compare-and-set instead. The decision is the
first value written, so every rank reads the same one: all survivors apply the step or none
does. The optimizer steps only after "commit"; a rank that leaves (a collective failed, the
generation was aborted or stopped at a step boundary) therefore holds exactly the state after
its last committed step, which it keeps in memory for the next generation. Whether step ``k`` runs
at all is decided the same way (``g<n>/go/<k>``: the first rank to enter it writes "go", the
coordinator stopping the generation at that boundary writes "stop").

The store keys and the atomic decisions (vote, go/stop, leave) are ``membership``'s, shared with
the coordinator.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ntp_planner.executor.check.holders import holdings
from ntp_planner.executor.elastic import handover
from ntp_planner.executor.elastic import membership as ms
from ntp_planner.executor.elastic.faults import Fault, kill_host
from ntp_planner.executor.elastic.relayout import Layout
from ntp_planner.executor.model.batch import sample_rows, synthetic_batch
from ntp_planner.executor.parallel.comm import Comm, lost_peer
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.step import build, synced_grads, train_step


@dataclass(frozen=True)
class Generation:
    """What every process reads to enter generation ``number``."""

    number: int
    layout: Layout | None  # None: the run is over, leave
    start_step: int  # the first step this generation runs (steps count from 0)
    consumed: int  # samples consumed by the committed steps before ``start_step``
    source: str  # where the state comes from: "init" (the seed), "memory" (peers) or "checkpoint"
    checkpoint_step: int | None = None  # with source "checkpoint": the checkpoint's last step
    previous: tuple[int, RunSpec, tuple[int, ...]] | None = None  # source "memory": (generation, spec, procs)
    # of the layout the committed state is held in


@dataclass(frozen=True)
class LiveConfig:
    """What every process of a live run shares."""

    base: RunSpec  # the healthy run (its batch is the sample pool)
    steps: int
    backend: str
    timeout_s: float  # collective timeout of each generation's process group
    faults: tuple[Fault, ...] = ()
    checkpoint_every: int = 0  # 0: no checkpoints
    checkpoint_dir: str = ""


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault throws inside a collective (the process then crashes)."""


class Leave(Exception):
    """This process leaves the generation (why in the message); its state is the committed one."""


def is_peer_loss(exc: BaseException) -> bool:
    """Whether an exception says a peer was lost (a collective failed or timed out), not that this
    process itself is broken."""
    return not isinstance(exc, InjectedFault) and lost_peer(exc)


class _ProcView:
    """The launcher's progress array seen through a rank number: ``Comm`` writes slot 3 rank + i,
    the launcher reads slot 3 proc + i."""

    def __init__(self, progress, proc: int, rank: int):
        self.progress, self.offset = progress, 3 * (proc - rank)

    def __setitem__(self, i: int, value: int) -> None:
        self.progress[i + self.offset] = value

    def __getitem__(self, i: int) -> int:
        return self.progress[i + self.offset]


def serve(proc: int, store, cfg: LiveConfig, progress=None, first_generation: int = 0) -> None:
    """Process ``proc``'s whole life: every generation from ``first_generation`` until the run is over."""
    torch.set_num_threads(1)
    torch.set_default_dtype(getattr(torch, cfg.base.dtype))
    pool = synthetic_batch(cfg.base)
    ms.ready(store, proc)
    # generation -> this process's committed state in that generation's layout. Older ones are
    # kept until a generation names a later one as its source: the coordinator carries from the
    # last generation whose every rank had its state in place, which is older than this
    # process's last one when a peer died during the carry (and no step ran since, so the older
    # state is still the committed one). An idle process keeps its states too, for the same reason.
    states: dict[int, dict] = {}
    n = first_generation
    while True:
        gen = ms.await_generation(store, n)
        if gen.layout is None:
            return
        if gen.previous is not None:
            states = {k: v for k, v in states.items() if k >= gen.previous[0]}
        elif gen.source != "memory":
            states = {}  # from a checkpoint or the initial weights: what it held is history
        if gen.layout.spec is not None and proc in gen.layout.procs:
            held = states.get(gen.previous[0], {}) if gen.previous else {}
            got = _run_generation(proc, store, gen, held, cfg, pool, progress)
            if got is not None:
                states[n] = got
        n += 1


def _run_generation(proc, store, gen: Generation, state: dict, cfg: LiveConfig, pool, progress) -> dict | None:
    """Train this generation's steps as its rank. Returns the committed state when leaving or
    done, in this generation's layout, or None when it left before its state was in place (the
    coordinator then carries from the previous layout again)."""
    n, layout = gen.number, gen.layout
    spec, rank = layout.spec, layout.procs.index(proc)
    tr, step, installed = None, gen.start_step, False
    try:
        t0 = time.time()
        dist.init_process_group(
            cfg.backend,
            store=dist.PrefixStore(ms.group_prefix(n), store),
            rank=rank,
            world_size=spec.world_size,
            timeout=timedelta(seconds=cfg.timeout_s),
        )
        view = None if progress is None else _ProcView(progress, proc, rank)
        tr = build(spec, rank, Comm(spec, rank, view, timedelta(seconds=cfg.timeout_s)), torch.device("cpu"))
        t1 = time.time()
        moved = _bring_state(proc, store, gen, state, cfg, tr)
        t2, installed = time.time(), True
        ms.report_times(store, n, rank, {"regroup_s": t1 - t0, "move_s": t2 - t1, "bytes": moved, "t": t2})
        first_grads = []
        for step in range(gen.start_step, cfg.steps):
            _live_step(proc, store, gen, cfg, pool, tr, step, first_grads)
        # a fault at step ``cfg.steps`` fires here, in the final gather: every step is committed,
        # and the next generation runs no step, it only gathers again (its holdings carry no
        # gradients: nothing was synced since the regroup)
        tr.comm.fault = _injector(cfg.faults, proc, cfg.steps, store)
        if tr.engine:
            tr.engine.materialize()  # ZeRO-3: the full parameters, for the comparison
        held = tr.comm.gather_objects(holdings(tr.model, spec, rank, first_grads or None))
        tr.comm.fault = None
        if rank == 0:
            ms.finish(store, n, [h for per_rank in held for h in per_rank])
        # the committed state, kept: a peer that fails in the gather after this rank's part of it
        # went through makes the coordinator re-plan, and the next generation carries it from here
        return handover.snapshot(tr)
    except Exception as exc:
        if not (isinstance(exc, Leave) or is_peer_loss(exc)):
            raise  # this process is broken: it dies, and the others recover from that
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        ms.leave(store, n, proc, why, step)
        _wake_peers(rank, spec.world_size)
        return handover.snapshot(tr) if installed else None
    finally:
        if tr is not None:  # ZeRO-2/3's engine and its ``BlockShards`` refer to each other: without this
            tr.comm.groups.clear()  # their groups outlive the generation until a garbage collection, and
            # a peer waiting in one of them waits out the whole collective timeout instead of failing at once
        if dist.is_initialized():
            dist.destroy_process_group()


def _bring_state(proc, store, gen: Generation, state: dict, cfg: LiveConfig, tr) -> int:
    """The committed state into the new model and optimizer: from the peers (``handover.carry``)
    or a checkpoint; the initial weights stay as built. Returns the bytes received."""
    if gen.source == "memory":
        _fail_in_carry(cfg.faults, proc, gen.start_step, store)
        _, old_spec, old_procs = gen.previous
        return handover.carry(old_spec, old_procs, gen.layout.procs, tr, state, gen.start_step, cfg.timeout_s)
    if gen.source == "checkpoint" and gen.checkpoint_step is not None:
        handover.load(cfg.checkpoint_dir, gen.checkpoint_step, tr)
    return 0


def _live_step(proc, store, gen: Generation, cfg: LiveConfig, pool, tr, step: int, first_grads: list) -> None:
    """Step ``step`` under the commit protocol: run only on "go", fire this process's injected
    faults in its collectives, vote after the gradient sync and let the optimizer step only on
    "commit" (``Leave`` otherwise); a checkpoint after it when one is due."""
    from ntp_planner.executor import checkpoint

    n, spec, rank, batch = gen.number, tr.spec, tr.rank, tr.spec.total_sequences
    if not ms.may_run(store, n, step):
        raise Leave(f"stopped before step {step}")
    consumed = gen.consumed + (step - gen.start_step) * batch
    rows = sample_rows(cfg.base, consumed, batch)
    tr.comm.fault = _injector(cfg.faults, proc, step, store)

    def vote(share: float) -> None:
        if tr.comm.fault is not None and not ms.fired(store, proc, step):
            tr.comm.fault("dp")  # a step without collectives (a layout of one process) fails at its end
        tr.comm.fault = None
        if not first_grads:  # the generation's first synced gradients, compared with the reference's
            first_grads.extend(synced_grads(tr))
        record = {"step": step, "generation": n, "consumed": consumed, "batch": batch}
        if ms.vote(store, n, step, rank, spec.world_size, share, record, cfg.timeout_s) != "commit":
            raise Leave(f"step {step} aborted")

    tokens, targets = pool
    train_step(tr, (tokens[rows], targets[rows]), vote)
    if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
        saved = handover.checkpoint_state(tr, step + 1)
        checkpoint.save(cfg.checkpoint_dir, step, consumed + batch, handover.checkpoint_spec(spec), rank, saved)
        if ms.saved(store, n, step) == spec.world_size:
            meta = {"consumed": consumed + batch, "generation": n}
            checkpoint.finish(cfg.checkpoint_dir, step, spec.world_size, meta)


def _wake_peers(rank: int, world: int) -> None:
    """Send every peer of the generation a one-element message before leaving it. gloo does not
    always wake a point-to-point receive whose peer leaves gracefully (a pipeline neighbour then
    waits out the whole collective timeout); such a receive takes this message instead, so its
    rank moves on and soon leaves too. The generation is aborted: whatever a peer computes from
    the message is never committed. Peers that are gone make the send fail, which is ignored."""
    if not dist.is_initialized():
        return
    works = []
    for peer in range(world):
        if peer != rank:
            try:
                works.append(dist.isend(torch.zeros(1), peer))
            except Exception:  # noqa: BLE001 - a peer already gone: nothing to wake
                pass
    deadline = time.monotonic() + 0.02  # in all: a peer that is not receiving must not hold this rank up
    for w in works:
        try:
            w.wait(timedelta(seconds=max(0.001, deadline - time.monotonic())))
        except Exception:  # noqa: BLE001
            pass


def _injector(faults, proc: int, step: int, store):
    """The hook ``Comm`` calls on entering a collective (its category as argument) in this step,
    or None when no fault of this process fires in it."""
    mine = [f for f in faults if f.proc == proc and f.step == step and f.how != "carry"]
    if not mine or ms.fired(store, proc, step):
        return None  # each fault fires once (a step redone after a rollback does not fail again)
    how = mine[0].how

    def fire(kind: str | None) -> None:
        if how == "sync" and kind != "dp":
            return
        ms.fire(store, proc, step, how)
        if how in ("kill", "sync"):
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "host":  # the whole torchrun node: this process's shell's agent and all under it
            kill_host(int(os.environ.get("NTP_AGENT_PID", os.getppid())))
        if how == "hang":
            while True:
                time.sleep(3600)
        raise InjectedFault(f"injected fault in a collective of step {step}")

    return fire


def _fail_in_carry(faults, proc: int, step: int, store) -> None:
    """A ``carry`` fault of this process for ``step`` (once): SIGKILL as the state starts to move."""
    if any(f.proc == proc and f.step == step and f.how == "carry" for f in faults):
        if ms.fire(store, proc, step, "carry"):
            os.kill(os.getpid(), signal.SIGKILL)
