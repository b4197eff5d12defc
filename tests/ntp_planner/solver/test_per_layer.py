"""Per-layer planning: partition and whole plans against brute force, explanations."""

import itertools
import json

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec, estimate_step
from cost_models.step import CostEnv
from ntp_planner.solver.per_layer import (
    StagePlanner,
    allowed_degrees,
    assemble,
    block_label,
    explain_degrees,
    lower_bound,
    partition,
)
from ntp_planner.solver.planner import make_plan
from ntp_planner.solver.search import SearchSpace
from topologies import CLUSTERS, Cluster

# Per-layer TP pays where memory binds between two degrees. ZeRO-2/3 relieve memory at a lower
# price on these setups, so the per-layer cases plan with the distributed optimizer only.
DISTOPT_ONLY = SearchSpace(zeros=(1,))


def brute_stage(p):
    best = None
    for degrees in itertools.product(*[sorted(t) for t in p.time_s]):
        if p.memory(degrees) <= p.budget_bytes and (best is None or p.objective(degrees) < best):
            best = p.objective(degrees)
    return best


@pytest.mark.parametrize(("headroom", "sp"), [(0.1, True), (0.6, True), (0.6, False)])
def test_partition_equals_brute_force(headroom, sp):
    model = MODELS["llama3-8b"].model_copy(update={"num_layers": 7})
    training = TrainingSpec(seq_len=4096, global_batch=32)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32)
    layout = ParallelLayout(tp=4, pp=3, dp=2, micro_batch=2, global_batch=32, sequence_parallel=sp, vpp=1)
    env = CostEnv(model, training, layout, cluster)
    planner = StagePlanner(env, allowed_degrees(model, layout, training.seq_len), headroom)
    got = partition(planner, window=2)
    m = layout.num_micro_batches
    best = None
    for counts in itertools.product(range(1, 5), repeat=3):
        if sum(counts) != 7:
            continue
        starts = [0, counts[0], counts[0] + counts[1]]
        times = [brute_stage(planner.problem(i, starts[i], counts[i])) for i in range(3)]
        if None in times:
            continue
        value = (m - 1) * max(times) + sum(times)
        best = value if best is None else min(best, value)
    if best is None:
        assert got is None
    else:
        assert got.pipeline_s == pytest.approx(best, rel=1e-9)


@pytest.fixture(scope="module")
def plans():
    args = (
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=8192, global_batch=256),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64),
    )
    return {
        "llama3-8b": (
            make_plan(*args, per_layer=False, top=1, space=DISTOPT_ONLY),
            make_plan(*args, per_layer=True, top=3, space=DISTOPT_ONLY),
        )
    }


# Llama 3 8B cut to 4 layers at tp4 dp2 on one 8-GPU host: six blocks (embedding, 4 layers, LM
# head), each at degree 1, 2 or 4: 3^6 = 729 layouts, few enough to cost every one.
SMALL = MODELS["llama3-8b"].model_copy(update={"num_layers": 4})
SMALL_TRAINING = TrainingSpec(seq_len=8192, global_batch=64)
HOST = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)


@pytest.mark.parametrize(
    ("sp", "usable_gib"),
    [
        (True, 14.5),  # only tp4 fits uniformly; two layers at tp2 fit beside it
        (True, 16.5),  # tp2 fits uniformly; two layers at tp1 fit beside it
        (False, 16.5),  # no uniform degree fits (tp4 needs 16.7 GiB without SP); mixes do
        (False, 19.0),  # tp1 does not fit (21.6 GiB); every layer at tp1, embedding and head at tp2 does
    ],
)
def test_per_layer_solver_finds_the_brute_force_optimum(sp, usable_gib):
    # Every per-block degree assignment costed by estimate_step, the fastest that fits memory
    # taken: the per-layer solver (stage degrees + partition) must reach the same step time, and
    # on these budgets it must beat every uniform layout that fits.
    layout = ParallelLayout(tp=4, dp=2, micro_batch=4, global_batch=64, sequence_parallel=sp, zero=1)
    headroom = 1 - usable_gib * 2**30 / HOST.gpu.hbm_bytes
    degrees = allowed_degrees(SMALL, layout, SMALL_TRAINING.seq_len)
    assert degrees == [[1, 2, 4]] * 6
    costs = {
        tps: estimate_step(SMALL, SMALL_TRAINING, layout.model_copy(update={"layer_tp": tps}), HOST)
        for tps in itertools.product(*degrees)
    }
    fitting = {tps: c.step_time_s for tps, c in costs.items() if c.fits(headroom)}
    brute = min(fitting.values())
    planner = StagePlanner(CostEnv(SMALL, SMALL_TRAINING, layout, HOST), degrees, headroom)
    solved = assemble(planner, partition(planner))
    cost = estimate_step(SMALL, SMALL_TRAINING, solved, HOST)
    assert cost.fits(headroom)
    assert cost.step_time_s == pytest.approx(brute, rel=1e-12)
    uniform = [s for tps, s in fitting.items() if len(set(tps)) == 1]
    assert not uniform or cost.step_time_s < min(uniform)


def test_per_layer_is_strictly_better_on_llama3_8b(plans):
    uniform, per_layer = plans["llama3-8b"]
    assert per_layer.layout.is_per_layer
    assert per_layer.predicted.step_time_s < uniform.predicted.step_time_s * 0.99
    # The projection Megatron can run is the best uniform layout; the gap is the throughput ratio.
    assert per_layer.megatron.layout == uniform.layout
    assert per_layer.megatron_gap == pytest.approx(uniform.predicted.step_time_s / per_layer.predicted.step_time_s - 1)
    # The saved plan re-costs to the same prediction.
    again = estimate_step(per_layer.model, per_layer.training, per_layer.layout, per_layer.cluster.build())
    assert again.step_time_s == per_layer.predicted.step_time_s


def test_lower_bound_is_below_the_real_cost(plans):
    _, per_layer = plans["llama3-8b"]
    lay = per_layer.layout.model_copy(update={"layer_tp": None, "chunk_layers": None})
    env = CostEnv(per_layer.model, per_layer.training, lay, per_layer.cluster.build())
    bound = lower_bound(env, allowed_degrees(per_layer.model, lay, per_layer.training.seq_len))
    assert bound <= per_layer.predicted.step_time_s


def test_explanations_cover_every_block_once(plans):
    _, p = plans["llama3-8b"]
    majority, runs = explain_degrees(p.model, p.training, p.layout, p.cluster.build())
    covered = [b for r in runs for b in range(r.first, r.last + 1)]
    assert covered == list(range(p.model.num_layers + 2))
    assert all((r.degree == majority) == (r.why is None) for r in runs)
    assert all(r.why.startswith(("faster", "memory")) for r in runs if r.why)


def test_block_labels():
    assert block_label(0, 0, 32) == "embedding"
    assert block_label(0, 5, 32) == "embedding + layers 0-4"
    assert block_label(4, 4, 32) == "layer 3"
    assert block_label(30, 33, 32) == "layers 29-31 + LM head"


def test_no_fit_names_the_tightest_stage():
    with pytest.raises(ValueError, match=r"on stage 0 \(its tightest\).*GiB short \([\d,]+ bytes\)"):
        make_plan(
            MODELS["llama3.1-405b"],
            TrainingSpec(seq_len=8192, global_batch=8),
            Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8),
        )


def test_cli_per_layer_flag_and_explain(tmp_path, plans):
    from typer.testing import CliRunner

    from ntp_planner.cli import app

    out = tmp_path / "p.json"
    args = ["plan", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "64", "--global-batch", "256", "--max-zero", "1"]
    args += ["-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Per-layer TP degrees" in result.stdout and "Megatron-expressible projection" in result.stdout
    saved = json.loads(out.read_text())
    assert saved["per_layer_tp"] == list(plans["llama3-8b"][1].per_layer_tp)
    uniform = json.loads(CliRunner().invoke(app, [*args[:-2], "--uniform", "--json"]).stdout)
    assert set(uniform["per_layer_tp"]) == {uniform["layout"]["tp"]} and uniform["megatron"] is None
    explained = json.loads(CliRunner().invoke(app, ["explain", str(out), "--json"]).stdout)
    assert explained["megatron_gap"] > 0.01


def test_uneven_pipeline_split_relieves_the_lm_head_stage():
    from ntp_planner.solver.per_layer import rebalance_uniform
    from ntp_planner.solver.search import Candidate

    model, training = MODELS["llama3-8b"], TrainingSpec(seq_len=8192, global_batch=64)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    even = ParallelLayout(tp=4, pp=4, dp=4, global_batch=64, sequence_parallel=True, distributed_optimizer=True)
    cost = estimate_step(model, training, even, cluster)
    better = rebalance_uniform(model, training, cluster, 0.1, Candidate(layout=even, cost=cost))
    assert better is not None and better.layout.layer_tp is None  # still one degree: Megatron-expressible
    counts = better.layout.stage_layers(32)
    assert sum(counts) == 32 and counts[-1] < max(counts)  # the 128K-vocabulary head's stage takes fewer layers
    assert better.cost.step_time_s < cost.step_time_s


def test_interleaved_degrees_land_on_the_layers_each_stage_chunk_holds():
    """Under vpp 2 at pp 2, stage 0 holds chunks 0 and 2 and stage 1 chunks 1 and 3: a stage's
    solved degrees go to those layers (not to a contiguous range), and the Plan's ``pipeline``
    states the same chunks with the same degrees."""
    from types import SimpleNamespace

    from ntp_planner.plan import chunk_placements
    from ntp_planner.solver.per_layer import assemble

    model = MODELS["llama3-8b"].model_copy(update={"num_layers": 8})
    lay = ParallelLayout(tp=4, pp=2, vpp=2, global_batch=8)
    # chunks of 3, 2, 2, 1 layers; stage 0 runs embedding + layers 0-2 and 5-6; stage 1 layers 3-4, 7 + head
    stage0 = SimpleNamespace(degrees=(4, 2, 2, 2, 1, 1))
    stage1 = SimpleNamespace(degrees=(4, 4, 2, 4))
    part = SimpleNamespace(counts=(3, 2, 2, 1), solutions=(stage0, stage1))
    out = assemble(SimpleNamespace(model=model, layout=lay), part)
    assert out.chunk_layers == (3, 2, 2, 1)
    assert out.layer_tp == (4, 2, 2, 2, 4, 4, 1, 1, 2, 4)  # embedding, layers 0..7, LM head
    chunks = chunk_placements(out, model.num_layers)
    assert [(c.stage, c.layers, c.tp) for c in chunks] == [
        (0, [0, 1, 2], [4, 2, 2, 2]), (1, [3, 4], [4, 4]), (0, [5, 6], [1, 1]), (1, [7], [2, 4]),
    ]  # fmt: skip
