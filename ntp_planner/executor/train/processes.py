"""How the executor starts its processes: forked from a server that has imported torch once.

A spawned process is a fresh interpreter that imports torch and the executor again: 2-3 s of
CPU each on a 2-core machine, so a run of 8 ranks spent longer starting than training. A
``forkserver`` context starts one server process per launcher, preloads the modules there, and
forks every rank from it: a rank starts in milliseconds with torch already imported (and no
threads started yet, so the fork is safe; CUDA is never initialised in the server). A forked
rank has the server's environment, not the launcher's at the time of the launch: what a rank
must see of it travels as an argument (``launch``'s ``worker_init``).
"""

from __future__ import annotations

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "ntp_planner.executor.train.runtime", "ntp_planner.executor.elastic.worker"]


def context():
    """The multiprocessing context every launcher of the executor and the profiler uses."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
