"""From the three inputs to a Plan: by searching (``make_plan``) or from a given layout."""

from __future__ import annotations

from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from cost_models.step import StepCost, estimate_step
from cost_models.training import TrainingSpec
from ntp_planner.plan import ClusterInputs, Plan, RunnerUp, inputs_hash
from ntp_planner.solver.placement import place_ranks
from ntp_planner.solver.search import NoLayoutFits, SearchSpace, no_fit_message, search
from topologies.cluster import Cluster
from topologies.errors import InputError


def runner_up(layout: ParallelLayout, cost: StepCost) -> RunnerUp:
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
    runtime: str = "megatron",
) -> Plan:
    inputs = ClusterInputs(
        spec=cluster.spec,
        num_gpus=cluster.num_gpus,
        gpus_per_domain=cluster.gpus_per_domain,
        failed_gpus=sorted(cluster.failed_gpus),
    )
    return Plan(
        per_layer_tp=list(layout.block_tp(model.num_layers)),
        model=model,
        training=training,
        cluster=inputs,
        inputs_hash=inputs_hash(model, training, inputs, layout, runtime),
        headroom=headroom,
        layout=layout,
        placement=place_ranks(layout.rank_grid, cluster),
        predicted=cost,
        runners_up=runners_up,
        source=source,
        runtime=runtime,
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
    objective: str = "step-time",
    strategy: str = "ntp",
    candidates: int = 8,
    seed: int = 0,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
) -> Plan:
    """The fastest layout that fits, plus ``top - 1`` runners-up. With ``per_layer`` the TP
    degree may differ per layer (it is chosen only when it beats every uniform layout), and the
    best uniform layout is kept as the Megatron-expressible projection. ValueError if none fits.
    With ``objective="goodput"`` the ``candidates`` fastest are simulated under failures drawn
    from ``seed`` (the same failures for every candidate). ``efficiency`` may carry a measured
    profile (``Efficiency.with_profile``)."""
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom {headroom} must lie in [0, 1): it is the fraction of HBM kept free")
    if top < 1:
        raise InputError(f"top {top} (layouts to keep) must be at least 1")
    from ntp_planner.solver.per_layer import rebalance_uniform, search_per_layer

    pass_caches: dict = {}  # block passes, shared by the uniform and the per-layer search
    result = search(model, training, cluster, headroom, space, efficiency, pass_caches)
    # Uneven pipeline splits of the two best uniform layouts (Megatron runs those too).
    rebalanced = [
        rebalance_uniform(model, training, cluster, headroom, c, efficiency=efficiency) for c in result.ranked[:2]
    ]
    uniform = sorted([*result.ranked, *[c for c in rebalanced if c is not None]], key=_rank)
    ranked = list(uniform)
    if per_layer:
        best_uniform = uniform[0].cost.step_time_s if uniform else float("inf")
        found = search_per_layer(
            model, training, cluster, headroom, space, best_uniform, pass_caches=pass_caches, efficiency=efficiency
        )
        ranked = sorted(ranked + found, key=_rank)
    if not ranked:  # none valid: the inputs' divisibility (bad input); valid ones, none fitting: exit code 3
        error = NoLayoutFits if result.least_memory is not None else InputError
        raise error(no_fit_message(result, model, cluster, headroom))
    if objective not in ("step-time", "goodput"):
        raise InputError(f"objective {objective!r} is not one of step-time, goodput")
    ranking = []
    if objective == "goodput":
        ranking = goodput_ranking(model, training, cluster, headroom, ranked[:candidates], strategy, seed)
        chosen = {r.layout for r in ranking[:1]}
        ranked = sorted(ranked, key=lambda c: (c.layout not in chosen, _rank(c)))
    best, *rest = ranked[:top]
    megatron = None
    if best.layout.is_per_layer and uniform:
        megatron = runner_up(uniform[0].layout, uniform[0].cost)
    plan = _plan(
        model,
        training,
        cluster,
        best.layout,
        best.cost,
        headroom,
        [runner_up(c.layout, c.cost) for c in rest],
        "search",
        efficiency.runtime,
    )
    return plan.model_copy(
        update={
            "megatron": megatron,
            "objective": objective,
            "goodput_strategy": strategy if ranking else None,
            "goodput_ranking": ranking,
            "search_notes": result.notes,
        }
    )


GOODPUT_DAYS, GOODPUT_TRIALS = 7, 20  # a short simulation: enough to rank layouts, not to report goodput


def goodput_ranking(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    headroom: float,
    candidates,
    strategy: str,
    seed: int,
) -> list:
    """Rank ``candidates`` by tokens/s x expected capacity goodput under ``strategy`` (a short
    simulation at the default failure rates). Each candidate gets a generator from ``seed``, so
    all see the same failures (common random numbers): the ranking compares layouts, not luck."""
    import numpy as np

    from ntp_planner.failures.sim_config import STRATEGIES, SimConfig
    from ntp_planner.failures.simulator import simulate
    from ntp_planner.plan import GoodputEntry

    if strategy not in STRATEGIES:
        raise InputError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    entries = []
    for c in candidates:
        plan = _plan(model, training, cluster, c.layout, c.cost, headroom, [], "search")
        sim = SimConfig(days=GOODPUT_DAYS, trials=GOODPUT_TRIALS)
        results, _ = simulate(plan, sim, [strategy], np.random.default_rng(seed))
        good = results[strategy].mean.capacity_goodput
        entries.append(
            GoodputEntry(
                layout=c.layout,
                tokens_per_s=c.cost.tokens_per_s,
                capacity_goodput=good,
                effective_tokens_per_s=c.cost.tokens_per_s * good,
            )
        )
    return sorted(entries, key=lambda e: -e.effective_tokens_per_s)


def plan_from_layout(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    layout: ParallelLayout,
    headroom: float = 0.1,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
) -> Plan:
    """A Plan for a layout the user chose (validated and costed, memory not enforced)."""
    cost = estimate_step(model, training, layout, cluster, efficiency)
    return _plan(model, training, cluster, layout, cost, headroom, [], "user", efficiency.runtime)
