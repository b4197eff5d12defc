"""Run a function on a few forked gloo ranks (CPU) and return what each rank returned.

Forked, not spawned: the children inherit the imported torch, so a 2-4 rank case costs well
under a second. Each child joins a gloo group through a FileStore in ``tmp``, runs ``fn(rank)``,
destroys the group and exits without running the parent's exit handlers; the parent waits at
most ``timeout_s`` and kills (by pid) any child still alive.

A result travels as plain pickled bytes, flushed before the child exits. Put on the queue as it
is, a tensor would go by torch's shared-memory reduction: a file descriptor the parent fetches
from the child's resource sharer after the child may already have exited, which failed as
``ConnectionResetError`` on a loaded machine.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import traceback
from datetime import timedelta
from pathlib import Path


def _child(rank: int, world: int, store: str, fn, queue, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    code = 0
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
        )
        try:
            value = fn(rank)
        finally:
            dist.destroy_process_group()
        queue.put((rank, True, pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        queue.put((rank, False, traceback.format_exc()))
        code = 1
    finally:
        queue.close()
        queue.join_thread()  # the feeder thread has written everything before the process ends
        os._exit(code)


def run_ranks(world: int, fn, tmp: Path, timeout_s: float = 30.0) -> list:
    """``[fn(0), ..., fn(world - 1)]``, each run on its own gloo rank; a rank's exception is
    raised here with its traceback."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    store = str(tmp / "gloo_store")
    procs = [ctx.Process(target=_child, args=(r, world, store, fn, queue, timeout_s)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    try:
        for _ in range(world):
            rank, ok, value = queue.get(timeout=timeout_s)
            if not ok:
                errors.append(f"rank {rank}:\n{value}")
                break
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
