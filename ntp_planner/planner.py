"""From the three inputs to a Plan: by searching (``make_plan``) or from a given layout."""

from __future__ import annotations

from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from cost_models.step import StepCost, estimate_step
from cost_models.training import TrainingSpec
from ntp_planner.placement import place_ranks
from ntp_planner.plan import ClusterInputs, Plan, RunnerUp, inputs_hash
from ntp_planner.search import SearchSpace, no_fit_message, search
from topologies.cluster import Cluster


def _runner_up(layout: ParallelLayout, cost: StepCost) -> RunnerUp:
    return RunnerUp(
        layout=layout,
        step_time_s=cost.step_time_s,
        mfu=cost.mfu,
        tokens_per_s=cost.tokens_per_s,
        memory_per_gpu_bytes=cost.memory_per_gpu_bytes,
        time_breakdown_s=cost.time_breakdown_s,
    )


def _plan(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    layout: ParallelLayout,
    cost: StepCost,
    headroom: float,
    runners_up: list[RunnerUp],
    source: str,
) -> Plan:
    inputs = ClusterInputs(spec=cluster.spec, num_gpus=cluster.num_gpus, failed_gpus=sorted(cluster.failed_gpus))
    return Plan(
        model=model,
        training=training,
        cluster=inputs,
        inputs_hash=inputs_hash(model, training, inputs),
        headroom=headroom,
        layout=layout,
        placement=place_ranks(layout.world_size, layout.tp, cluster),
        predicted=cost,
        runners_up=runners_up,
        source=source,
    )


def make_plan(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    headroom: float = 0.1,
    top: int = 5,
    space: SearchSpace = SearchSpace(),
) -> Plan:
    """The fastest layout that fits, plus ``top - 1`` runners-up. ValueError if none fits."""
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom {headroom} must lie in [0, 1): it is the fraction of HBM kept free")
    if top < 1:
        raise ValueError(f"--top {top} must be at least 1")
    result = search(model, training, cluster, headroom, space)
    if not result.ranked:
        raise ValueError(no_fit_message(result, model, cluster, headroom))
    best, *rest = result.ranked[:top]
    return _plan(
        model,
        training,
        cluster,
        best.layout,
        best.cost,
        headroom,
        [_runner_up(c.layout, c.cost) for c in rest],
        "search",
    )


def plan_from_layout(
    model: ModelSpec, training: TrainingSpec, cluster: Cluster, layout: ParallelLayout, headroom: float = 0.1
) -> Plan:
    """A Plan for a layout the user chose (validated and costed, memory not enforced)."""
    cost = estimate_step(model, training, layout, cluster)
    return _plan(model, training, cluster, layout, cost, headroom, [], "user")
