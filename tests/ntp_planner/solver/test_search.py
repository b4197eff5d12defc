"""The layout search is exhaustive over its space: it equals brute-force enumeration."""

import itertools

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec, check_layout, estimate_step
from cost_models.rank_grid import RankGrid
from ntp_planner.solver.search import SearchSpace, enumerate_layouts, no_fit_message, search
from topologies import CLUSTERS, Cluster


def expert_choices(model, tp, n, domain):
    """Every (etp, ep, dispatcher) of an MoE search: etp the attention's tp or 1, ep any degree
    1..n, the dispatcher 'flex' when some EP group's ranks lie in two NVLink domains (found from
    the grid's own groups, rank // domain), else 'alltoall'. A dense model: the defaults only."""
    if not model.is_moe:
        return [{}]
    out = []
    etps = {1} if model.bias else {tp, 1}  # megatron-core: "Bias in Moe is only supported when ETP==1"
    for etp, ep in itertools.product(sorted(etps), range(1, n + 1)):
        grid = RankGrid(tp=tp, dp=n // tp)  # pp and cp do not move an EP group off its domain here
        try:
            groups = grid.expert_groups("ep", ep, etp)
        except ValueError:
            continue
        spans = any(len({r // domain for r in g}) > 1 for g in groups)
        fields = {"ep": ep, "moe_dispatcher": "flex" if spans else "alltoall"}
        out.append(fields if etp == tp else {**fields, "etp": etp})
    return out


def valid_layouts(model, training, cluster, space):
    """Every combination of degrees 1..N and every SearchSpace value that the layout rules
    (``check_layout``) accept: no divisor tricks, no pruning."""
    n = cluster.num_gpus
    for tp, pp, cp in itertools.product(range(1, n + 1), repeat=3):
        dp = n // (tp * pp * cp)
        if tp * pp * dp * cp != n or pp > space.max_pp:
            continue
        if cp not in (space.cps or (1,)):
            continue
        experts = expert_choices(model, tp, tp * cp * dp, cluster.spec.domain_size)
        for mb, vpp, rc, expert in itertools.product(space.micro_batches, space.vpps, space.recomputes, experts):
            try:
                layout = ParallelLayout(
                    tp=tp,
                    pp=pp,
                    dp=dp,
                    cp=cp,
                    micro_batch=mb,
                    vpp=vpp,
                    recompute=rc,
                    global_batch=training.global_batch,
                    sequence_parallel=tp > 1,
                    **expert,
                )
                check_layout(layout, model, training, n, cluster.spec.domain_size)
            except ValueError:
                continue
            yield layout


def brute_force(model, training, cluster, space, headroom):
    """Every valid layout, filtered only by memory. A layout takes the first ZeRO level of the
    space that fits (the search's stated rule)."""
    found = {}
    for layout in valid_layouts(model, training, cluster, space):
        zeros = space.zeros if training.distributed_optimizer and layout.dp * layout.cp > 1 else (0,)
        for z in zeros:
            zeroed = layout.model_copy(update={"zero": z})
            cost = estimate_step(model, training, zeroed, cluster)
            if cost.fits(headroom):
                found[zeroed] = cost.step_time_s
                break
    return found


@pytest.mark.parametrize(
    ("model", "gpus", "seq", "batch", "cps"),
    [("llama3-8b", 16, 4096, 32, (1,)), ("gpt3-175b", 64, 2048, 64, (1, 2)), ("llama3-70b", 32, 8192, 32, (1,))],
)
def test_search_equals_brute_force(model, gpus, seq, batch, cps):
    m = MODELS[model]
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus)
    space = SearchSpace(cps=cps)
    result = search(m, training, cluster, 0.1, space)
    expected = brute_force(m, training, cluster, space, 0.1)
    assert {c.layout for c in result.ranked} == set(expected)
    # the search shares block passes between layouts; each cost equals a fresh estimate exactly
    assert {c.layout: c.cost.step_time_s for c in result.ranked} == expected
    times = [c.cost.step_time_s for c in result.ranked]
    assert times == sorted(times)
    assert expected, "the case must have feasible layouts to compare"
    assert times[0] == min(expected.values())


def test_moe_search_space_equals_brute_force_and_folds_ep_over_tp():
    """Mixtral 8x7B on 16 H100 (two 8-GPU domains): the search equals brute force over etp in
    {tp, 1}, every ep and the dispatcher the EP group's span calls for, and it considers layouts
    that only folding allows (ep > dp x cp: EP spanning the TP ranks) and flex dispatch."""
    m = MODELS["mixtral-8x7b"]
    training = TrainingSpec(seq_len=4096, global_batch=16)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    space = SearchSpace(cps=(1,), micro_batches=(1, 2), vpps=(1, 2), recomputes=("full",))
    layouts = enumerate_layouts(m, training, cluster, space)
    first = 1 if training.distributed_optimizer else 0
    expected = {
        lay.model_copy(update={"zero": first if lay.dp > 1 else 0})
        for lay in valid_layouts(m, training, cluster, space)
    }
    assert set(layouts) == expected and len(layouts) == len(expected)
    folded = [lay for lay in layouts if lay.folded]
    assert folded and all(lay.etp == 1 and lay.tp > 1 for lay in folded)
    assert any(lay.ep > lay.dp * lay.cp for lay in folded)  # refused before folding
    assert {lay.moe_dispatcher for lay in layouts} == {"alltoall", "flex"}
    # tp 8 unfolded, ep 2 (or tp 2, ep 8): 16 ranks over both nodes -> flex; tp 8, etp 1, ep 8: one node
    by_key = {(lay.tp, lay.expert_tp, lay.ep, lay.pp): lay.moe_dispatcher for lay in layouts}
    assert by_key[(8, 8, 2, 1)] == "flex" and by_key[(8, 1, 8, 1)] == "alltoall" and by_key[(2, 2, 8, 1)] == "flex"


def test_moe_search_equals_costed_brute_force_with_folded_layouts():
    """The costed MoE search equals brute force (every valid layout costed afresh, the first ZeRO
    level that fits): Mixtral 8x7B's experts with 2 attention heads (tp 1 or 2) on 16 H100, one
    stage, so folded layouts (etp 1 under tp 2) compete with unfolded ones."""
    base = MODELS["mixtral-8x7b"]
    m = type(base).model_validate({**base.model_dump(), "name": "mixtral-2-heads", "num_heads": 2, "num_kv_heads": 2})
    training = TrainingSpec(seq_len=4096, global_batch=16)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    space = SearchSpace(cps=(1,), micro_batches=(1,), vpps=(1,), recomputes=("full",), max_pp=1)
    result = search(m, training, cluster, 0.1, space)
    expected = brute_force(m, training, cluster, space, 0.1)
    assert {c.layout: c.cost.step_time_s for c in result.ranked} == expected
    assert result.ranked[0].cost.step_time_s == min(expected.values())
    folded = [c.layout for c in result.ranked if c.layout.folded]
    assert {lay.ep for lay in folded} == {1, 2, 4, 8} and all(lay.tp == 2 and lay.etp == 1 for lay in folded)


def test_biased_experts_are_searched_at_etp_1_only():
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    layouts = enumerate_layouts(MODELS["gpt-oss-20b"], TrainingSpec(seq_len=4096, global_batch=16), cluster)
    assert layouts and {lay.expert_tp for lay in layouts} == {1} and max(lay.tp for lay in layouts) == 8


def test_dense_search_sets_no_expert_fields():
    """A dense model's layouts carry the defaults (etp unset, alltoall): the plans and their
    inputs hashes are those of before folding."""
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    layouts = enumerate_layouts(MODELS["llama3-8b"], TrainingSpec(seq_len=4096, global_batch=32), cluster)
    assert layouts and all(lay.etp is None and lay.ep == 1 and lay.moe_dispatcher == "alltoall" for lay in layouts)
    assert len(layouts) == len({lay.model_dump_json() for lay in layouts})


def test_memory_binds_on_a_big_model():
    result = search(
        MODELS["llama3-70b"],
        TrainingSpec(seq_len=8192, global_batch=32),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32),
    )
    assert result.rejected_memory > 0 and result.ranked
    assert all(c.cost.fits(0.1) for c in result.ranked)


def test_no_fit_message_names_the_shortfall():
    model, cluster = MODELS["llama3.1-405b"], Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    result = search(model, TrainingSpec(seq_len=8192, global_batch=8), cluster)
    assert not result.ranked
    msg = no_fit_message(result, model, cluster, 0.1)
    least = result.least_memory.cost.memory_per_gpu_bytes
    assert f"{(least - 0.9 * 80 * 2**30) / 2**30:.1f} GiB short" in msg and result.least_memory.layout.describe() in msg


def test_llama3_405b_on_16k_h100_lands_in_the_published_mfu_band():
    # Llama 3 (arXiv 2407.21783, Table 4) reports 38-43% MFU on 16K H100 at 8K tokens.
    result = search(
        MODELS["llama3.1-405b"],
        TrainingSpec(seq_len=8192, global_batch=2048),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16384),
    )
    best = result.ranked[0]
    assert 0.35 <= best.cost.mfu <= 0.55, best.layout.describe()
    assert best.layout.tp == 8


@pytest.mark.parametrize(
    ("gpus", "per_domain", "tps"),
    [
        (128, None, {1, 2, 4, 8}),  # domains of 72 and 56: gcd 8
        (128, 64, {1, 2, 4, 8, 16, 32, 64}),  # two domains of 64
        (64, None, {1, 2, 4, 8, 16, 32, 64}),  # one domain of 64
        (144, None, {1, 2, 4, 8}),  # 72 = 8 x 9; llama3-70b's 64 heads rule out 3, 6, 9, ...
    ],
)
def test_tp_degrees_divide_the_used_domains(gpus, per_domain, tps):
    cluster = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=gpus, gpus_per_domain=per_domain)
    found = enumerate_layouts(MODELS["llama3-70b"], TrainingSpec(seq_len=4096, global_batch=128), cluster)
    assert {layout.tp for layout in found} == tps


def test_a_layout_shards_more_only_when_memory_asks():
    model, cluster = MODELS["llama3-70b"], Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    result = search(model, training, cluster, 0.1, SearchSpace(cps=(1,)))
    levels = {c.layout.zero for c in result.ranked}
    assert {1, 2, 3} <= levels  # all three levels appear in the ranking
    for c in result.ranked:
        if c.layout.zero > 1:  # the level below does not fit
            lower = c.layout.model_copy(update={"zero": c.layout.zero - 1})
            assert not estimate_step(model, training, lower, cluster).fits(0.1)
    only_distopt = search(model, training, cluster, 0.1, SearchSpace(cps=(1,), zeros=(1,)))
    assert len(only_distopt.ranked) < len(result.ranked)
    for c in only_distopt.ranked:  # nothing to shard without a second data-parallel rank
        assert c.layout.zero == (1 if c.layout.dp * c.layout.cp > 1 else 0)


def test_interleaving_keeps_to_megatrons_micro_batch_rule():
    model, cluster = MODELS["llama3-70b"], Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    result = search(model, TrainingSpec(seq_len=4096, global_batch=96), cluster, 0.1, SearchSpace(cps=(1,)))
    interleaved = [c.layout for c in result.ranked if c.layout.vpp > 1]
    assert interleaved and all(lay.num_micro_batches % lay.pp == 0 for lay in interleaved)


def test_moe_search_equals_costed_brute_force_over_every_grid():
    """Mixtral 8x7B on 16 H100: the costed search equals brute force over every tp, pp, etp in
    {tp, 1} and ep, folded layouts with ep > dp x cp (EP spanning the TP ranks) among them."""
    m = MODELS["mixtral-8x7b"]
    training = TrainingSpec(seq_len=4096, global_batch=16)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    space = SearchSpace(cps=(1,), micro_batches=(1,), vpps=(1,), recomputes=("full",))
    result = search(m, training, cluster, 0.1, space)
    expected = brute_force(m, training, cluster, space, 0.1)
    assert {c.layout: c.cost.step_time_s for c in result.ranked} == expected
    assert result.ranked[0].cost.step_time_s == min(expected.values())
    assert any(c.layout.folded and c.layout.ep > c.layout.dp for c in result.ranked)


def test_an_odd_sequence_runs_dense_tp_without_sequence_parallelism_and_says_so():
    """seq 4097 divides over no tp > 1: every dense layout with tp > 1 is kept with sequence
    parallelism off (check_layout accepts it), one note per such degree; 4096 gives no note."""
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    notes: list[str] = []
    odd = enumerate_layouts(MODELS["llama3-8b"], TrainingSpec(seq_len=4097, global_batch=32), cluster, notes=notes)
    even = enumerate_layouts(MODELS["llama3-8b"], TrainingSpec(seq_len=4096, global_batch=32), cluster)
    assert {lay.tp for lay in odd} == {lay.tp for lay in even} == {1, 2, 4, 8}
    assert not any(lay.sequence_parallel for lay in odd)
    assert all(lay.sequence_parallel == (lay.tp > 1) for lay in even)
    for lay in odd:
        check_layout(lay, MODELS["llama3-8b"], TrainingSpec(seq_len=4097, global_batch=32), 16, 8)
    assert [n.split(":")[0] for n in notes] == [f"seq_len 4097 does not divide over tp {t}" for t in (2, 4, 8)]
    quiet: list[str] = []
    enumerate_layouts(MODELS["llama3-8b"], TrainingSpec(seq_len=4096, global_batch=32), cluster, notes=quiet)
    assert quiet == []


def test_an_odd_sequence_skips_moe_tp_and_a_partial_one_keeps_the_degrees_it_divides():
    """MoE layers need sequence parallelism beside TP: at seq 4097 only tp 1 is left; at 4100
    (= 4 x 1025) tp 2 and 4 keep it and tp 8 alone is skipped."""
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    m = MODELS["mixtral-8x7b"]
    notes: list[str] = []
    odd = enumerate_layouts(m, TrainingSpec(seq_len=4097, global_batch=32), cluster, notes=notes)
    assert {lay.tp for lay in odd} == {1}
    assert all("skipped: MoE layers need sequence parallelism" in n for n in notes) and len(notes) == 3
    notes = []
    part = enumerate_layouts(m, TrainingSpec(seq_len=4100, global_batch=32), cluster, notes=notes)
    assert {lay.tp for lay in part} == {1, 2, 4}
    assert all(lay.sequence_parallel == (lay.tp > 1) for lay in part)
    assert [n.split(":")[0] for n in notes] == ["seq_len 4100 does not divide over tp 8"]
