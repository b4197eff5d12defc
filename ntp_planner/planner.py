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
        per_layer_tp=list(layout.block_tp(model.num_layers)),
        model=model,
        training=training,
        cluster=inputs,
        inputs_hash=inputs_hash(model, training, inputs),
        headroom=headroom,
        layout=layout,
        placement=place_ranks(layout.world_size, layout.tp, layout.pp, cluster),
        predicted=cost,
        runners_up=runners_up,
        source=source,
    )


def _rank(c):
    return (c.cost.step_time_s, c.cost.memory_per_gpu_bytes, c.layout.describe())


def make_plan(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    headroom: float = 0.1,
    top: int = 5,
    space: SearchSpace = SearchSpace(),
    per_layer: bool = True,
) -> Plan:
    """The fastest layout that fits, plus ``top - 1`` runners-up. With ``per_layer`` the TP
    degree may differ per layer (it is chosen only when it beats every uniform layout), and the
    best uniform layout is kept as the Megatron-expressible projection. ValueError if none fits."""
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom {headroom} must lie in [0, 1): it is the fraction of HBM kept free")
    if top < 1:
        raise ValueError(f"--top {top} must be at least 1")
    from ntp_planner.per_layer import rebalance_uniform, search_per_layer

    result = search(model, training, cluster, headroom, space)
    # Uneven pipeline splits of the best uniform layouts (Megatron runs those too).
    rebalanced = [rebalance_uniform(model, training, cluster, headroom, c) for c in result.ranked[:top]]
    uniform = sorted([*result.ranked, *[c for c in rebalanced if c is not None]], key=_rank)
    ranked = list(uniform)
    if per_layer:
        best_uniform = uniform[0].cost.step_time_s if uniform else float("inf")
        ranked = sorted(ranked + search_per_layer(model, training, cluster, headroom, space, best_uniform), key=_rank)
    if not ranked:
        raise ValueError(no_fit_message(result, model, cluster, headroom))
    best, *rest = ranked[:top]
    megatron = None
    if best.layout.is_per_layer and uniform:
        megatron = _runner_up(uniform[0].layout, uniform[0].cost)
    plan = _plan(
        model,
        training,
        cluster,
        best.layout,
        best.cost,
        headroom,
        [_runner_up(c.layout, c.cost) for c in rest],
        "search",
    )
    return plan.model_copy(update={"megatron": megatron})


def plan_from_layout(
    model: ModelSpec, training: TrainingSpec, cluster: Cluster, layout: ParallelLayout, headroom: float = 0.1
) -> Plan:
    """A Plan for a layout the user chose (validated and costed, memory not enforced)."""
    cost = estimate_step(model, training, layout, cluster)
    return _plan(model, training, cluster, layout, cost, headroom, [], "user")
