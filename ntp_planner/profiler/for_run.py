"""A profile made ready to predict one validate run: the run's own blocks measured here.

A validate run's shrunk model has shapes no profile made beforehand holds, so its blocks are
measured on the spot, in this process, with one thread as each rank runs (``measure_blocks``), and
added to the profile with a note. A profile of another dtype than the run's keeps its collectives
and sets its blocks aside (they time other kernels).
"""

from __future__ import annotations

from cost_models.profile import Profile
from ntp_planner.executor.check.predict import needed_blocks
from ntp_planner.executor.spec import RunSpec
from ntp_planner.profiler.cluster import local_cluster


def complete_profile(prof: Profile, spec: RunSpec, model_name: str, say=None) -> Profile:
    """``prof`` with every block ``spec`` runs measured (``say(text)`` hears what is measured)."""
    from ntp_planner.profiler.blocks import measure_blocks

    if prof.dtype != spec.dtype:
        note = f"validate runs {spec.dtype}: the profile's {prof.dtype} blocks set aside"
        prof = prof.model_copy(update={"dtype": spec.dtype, "blocks": (), "notes": (*prof.notes, note)})
    needed = needed_blocks(spec, model_name, prof, local_cluster(prof))
    missing = [(shape, mb) for shape, mb in needed if prof.block_time(shape, mb) is None]
    if not missing:
        return prof
    if say is not None:
        say(f"measuring the shrunk model's {len(missing)} block shapes on this machine (one process, one thread)")
    # small blocks: many repetitions, so that one slow moment of a shared host does not set a whole prediction
    blocks = measure_blocks(missing, device=prof.device.kind, dtype=prof.dtype, reps=15, warmup=2, threads_per_rank=1)
    note = f"validate measured {len(missing)} block shapes of a shrunk model"
    return prof.model_copy(update={"blocks": prof.blocks + tuple(blocks), "notes": (*prof.notes, note)})
