"""What a degraded replica costs, and the sentence that says why a replica is degraded or dropped.

A degraded replica runs every block of a stage at the stage's reduced width (the survivors of
its worst TP group), whatever degree the plan gave each block: a per-layer stage of healthy
width w that loses k GPUs runs all its blocks at w - k, as the executor's ``make_spec`` does.
So the healthy cost a degraded replica scales from is the cost of the plan's layout with every
block at the stage width, not the per-layer plan's own cost: a per-layer plan puts low degrees
where they run faster and high ones where memory binds, and neither survives the reduction.

Context parallelism: a replica's cp slices all run at the width of its worst slice. Every
attention layer exchanges keys and values between the ranks at the same TP position of each
slice (``RunSpec.cp_group``), which holds only while the slices shard heads alike; and the
slices run the same micro-batches in lockstep, so a wider slice would wait for the narrowest
anyway. The extra survivors of a healthier slice stay idle (``ReplicaState.gpus_idle``).
"""

from __future__ import annotations

from cost_models.step import StepCost, estimate_step
from ntp_planner.plan import Plan
from topologies.errors import InputError

GIB = 2**30


def degraded_basis(plan: Plan) -> StepCost:
    """The healthy cost a degraded replica of ``plan`` scales from: the plan's own for a uniform
    plan; for a per-layer plan, its layout with every block at the stage width (``layer_tp``
    dropped), its times multiplied by the plan's step time over a re-costing of the plan's own
    layout, so that a plan costed with a measured profile keeps its calibration (the ratio is 1
    for a plan costed analytically). Both are costed for the runtime the plan was costed for. A
    per-layer plan whose width cannot run every block (heads or FFN not divisible by it) keeps its
    own cost."""
    lay = plan.layout
    if not lay.is_per_layer:
        return plan.predicted
    cluster, eff = plan.cluster.build(), plan.default_efficiency
    try:
        whole = estimate_step(plan.model, plan.training, lay.model_copy(update={"layer_tp": None}), cluster, eff)
    except InputError:
        return plan.predicted
    own = estimate_step(plan.model, plan.training, lay, cluster, eff)
    scale = plan.predicted.step_time_s / own.step_time_s
    return whole.model_copy(update={"time_breakdown_s": {k: v * scale for k, v in whole.time_breakdown_s.items()}})


def lost_group_reason(full: int) -> str:
    return f"a TP group lost all {full} of its GPUs"


def policy_reason(policy: str) -> str:
    return f"policy {policy} drops every replica with a degraded TP group"


def memory_reason(degree: int, need_bytes: float, usable_bytes: float, min_degree: int, full: int) -> str:
    """Why a replica at ``degree`` does not fit.

    >>> memory_reason(3, 87.1 * GIB, 72 * GIB, 4, 4)
    'memory: at TP 3 the fullest GPU needs 87.1 GiB of 72.0 GiB usable (no degree below 4 fits)'
    """
    least = f"TP {min_degree} is the least that fits" if min_degree < full else f"no degree below {full} fits"
    return (
        f"memory: at TP {degree} the fullest GPU needs {need_bytes / GIB:.1f} GiB of {usable_bytes / GIB:.1f} GiB "
        f"usable ({least})"
    )


def time_reason(degree: int, one_micro_batch_s: float, healthy_s: float, power: float = 1.0) -> str:
    """Why a replica at ``degree`` runs no micro-batch within the healthy step.

    >>> time_reason(1, 9.5, 7.921)
    'step time: at TP 1 a step of one micro-batch takes 9.500 s, over the healthy step of 7.921 s'
    """
    boost = f" and {power:g}x power" if power != 1 else ""
    return (
        f"step time: at TP {degree}{boost} a step of one micro-batch takes {one_micro_batch_s:.3f} s, "
        f"over the healthy step of {healthy_s:.3f} s"
    )


def degraded_reason(
    stage_tp: tuple[int, ...], sequences: int, total: int, micro_batch: int, cp: int, per_layer: bool
) -> str:
    """What a degraded replica runs and why. Its batch is counted in sequences; with micro-batches
    of more than one sequence, they are re-cut and the last one may be smaller.

    >>> for part in degraded_reason((5, 5), 9, 16, 1, 2, False).split("; "):
    ...     print(part)
    runs at TP 5, the fewest survivors of its TP groups, its 2 cp slices at one width
    9 of 16 micro-batches fit the healthy step
    >>> degraded_reason((7,), 13, 16, 2, 1, False).split("; ")[1]
    '13 of 16 sequences fit the healthy step, as 7 micro-batches (6 of 2 sequences, 1 of 1)'
    """
    widths = sorted(set(stage_tp))
    tp = f"TP {widths[0]}" if len(widths) == 1 else "TP " + "/".join(map(str, stage_tp)) + " per stage"
    parts = [f"runs at {tp}, the fewest survivors of its TP groups"]
    parts += ["every block of a stage at its width"] if per_layer else []
    parts += [f"its {cp} cp slices at one width"] if cp > 1 else []
    if micro_batch == 1:
        return ", ".join(parts) + f"; {sequences} of {total} micro-batches fit the healthy step"
    whole, rest = divmod(sequences, micro_batch)
    cut = f"{whole} of {micro_batch} sequences" + (f", 1 of {rest}" if rest else "")
    return (
        ", ".join(parts)
        + f"; {sequences} of {total} sequences fit the healthy step, as {whole + (rest > 0)} micro-batches ({cut})"
    )
