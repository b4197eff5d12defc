"""Placement, re-plan, Megatron export and the executor's shrink agree on one rank order, for
tp, cp, dp, pp > 1. The order is written out here once, independently of RankGrid:
rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.rank_grid import RankGrid
from ntp_planner.emitters.megatron import nonuniform_tp_settings
from ntp_planner.executor.shrink.run import shrink
from ntp_planner.failures.replan import Replanner
from ntp_planner.solver.placement import place_ranks
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster

HOST = CLUSTERS["dgx-h100"].gpus_per_node  # 8 GPUs, one NVLink domain


def plan_rank(i: int, c: int, r: int, s: int, lay) -> int:
    """The documented order: TP rank i of cp rank c, replica r, stage s."""
    return i + lay.tp * (c + lay.cp * (r + lay.dp * s))


def coordinates(lay):
    return itertools.product(range(lay.pp), range(lay.dp), range(lay.cp))  # (s, r, c)


# tp * cp * dp a multiple of the host, so that the healthy placement is the identity
layouts = st.tuples(
    st.sampled_from([2, 4]), st.sampled_from([2, 4]), st.sampled_from([2, 4]), st.sampled_from([2, 3])
).filter(lambda d: d[0] * d[1] * d[2] % HOST == 0 and d[0] * d[1] * d[2] * d[3] <= 96)
slow = settings(max_examples=12, deadline=None)


def make_plan(tp, cp, dp, pp):
    lay = ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, global_batch=8 * dp)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=lay.world_size)
    return plan_from_layout(MODELS["megatron-1.7b"], TrainingSpec(seq_len=2048, global_batch=8 * dp), cluster, lay)


@slow
@given(layouts, st.data())
def test_placement_puts_tp_groups_on_slots_and_pipelines_on_rails(degrees, data):
    tp, cp, dp, pp = degrees
    lay = ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, global_batch=dp)
    spare_hosts = 2
    gpus = lay.world_size + spare_hosts * HOST
    failed = data.draw(st.sets(st.integers(0, gpus - 1), max_size=2))
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus, failed_gpus=frozenset(failed))
    placement = place_ranks(RankGrid(tp=tp, cp=cp, dp=dp, pp=pp), cluster)
    for s, r, c in coordinates(lay):
        group = [placement[plan_rank(i, c, r, s, lay)] for i in range(tp)]
        assert group == list(range(group[0], group[0] + tp)) and group[0] % tp == 0  # one aligned slot
        assert not set(group) & set(failed)
        if s:  # TP rank i of every stage on one rail
            before = [placement[plan_rank(i, c, r, s - 1, lay)] for i in range(tp)]
            assert [g % HOST for g in group] == [g % HOST for g in before]


@slow
@given(layouts, st.data())
def test_a_replan_without_failures_is_the_plan_placement(degrees, data):
    """Also for a placement that is not the identity: TP slots shuffled whole."""
    plan = make_plan(*degrees)
    lay = plan.layout
    slots = data.draw(st.permutations(range(lay.world_size // lay.tp)))
    shuffled = [slots[g // lay.tp] * lay.tp + g % lay.tp for g in range(lay.world_size)]
    for p in (plan, plan.model_copy(update={"placement": shuffled})):
        result = Replanner(p).replan(frozenset(), "ntp")
        assert result.rank_to_gpu == p.placement
        assert all(x.status == "healthy" for x in result.replicas)


@slow
@given(layouts, st.data())
def test_replan_and_megatron_export_agree_on_rank_positions(degrees, data):
    """pp * cp + 1 degraded TP slots, the first missing two GPUs: the packing fills one replica
    at TP tp-2 and puts one slot at TP tp-1 in a second, so Megatron's single reduced degree
    leaves the second replica's inactive ranks to be read from the rank map."""
    plan = make_plan(*degrees)
    lay = plan.layout
    hit = lay.pp * lay.cp + 1
    slots = data.draw(st.lists(st.integers(0, lay.world_size // lay.tp - 1), min_size=hit, max_size=hit, unique=True))
    failed = {slot * lay.tp for slot in slots} | {slots[0] * lay.tp + 1}
    result = Replanner(plan).replan(frozenset(failed), "ntp")
    gpus = result.rank_to_gpu
    for s, r, c in coordinates(lay):
        group = [gpus[plan_rank(i, c, r, s, lay)] for i in range(lay.tp)]
        width = result.replicas[r].stage_tp[s]
        assert None not in group[:width] and group[width:] == [None] * (lay.tp - width)
        assert len({g // HOST for g in group[:width]}) <= 1  # survivors of one NVLink domain
    degraded = [x for x in result.replicas if x.status == "degraded"]
    assert sorted({x.stage_tp[0] for x in degraded}) == ([2, 3] if lay.tp == 4 else [1])
    reduced = min(x.stage_tp[0] for x in degraded)
    inactive = nonuniform_tp_settings(plan, result)[0]["non_active_ranks_per_dp"]
    assert len(inactive) == len(degraded) * lay.cp * lay.pp
    for new_dp, replica in enumerate(degraded):  # Megatron numbers reduced replicas first
        for s, c in itertools.product(range(lay.pp), range(lay.cp)):
            empty = [i for i in range(lay.tp) if gpus[plan_rank(i, c, replica.replica, s, lay)] is None]
            assert inactive[f"{new_dp},{c},{s}"] == empty[: lay.tp - reduced]


@slow
@given(layouts, st.booleans(), st.data())
def test_the_executor_runs_each_process_as_its_plan_rank(degrees, with_failure, data):
    plan = make_plan(*degrees)
    lay = plan.layout
    result = None
    if with_failure:
        failed = data.draw(st.sets(st.integers(0, lay.world_size - 1), min_size=1, max_size=1))
        result = Replanner(plan).replan(frozenset(failed), "ntp")
    shrunk = shrink(plan, nproc=96, replan=result)
    spec, gpus = shrunk.spec, plan.placement if result is None else result.rank_to_gpu
    assert len(shrunk.plan_ranks) == spec.world_size
    for process, (rank, gpu) in enumerate(shrunk.plan_ranks):
        pipeline, stage = spec.locate(process)
        local = spec.replicas[pipeline].stages[stage].ranks.index(process)
        c = spec.replicas[pipeline].cp_rank
        r = shrunk.replicas[pipeline // spec.cp]
        s = shrunk.stage_groups[stage][0]
        assert rank == plan_rank(local, c, r, s, lay) and gpu == gpus[rank] is not None
