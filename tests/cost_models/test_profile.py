"""A measured profile in the cost model: lookups, interpolation, the estimate it changes, refusals,
and the calibration fit."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from cost_models import ParallelLayout, TrainingSpec, estimate_step, resolve_model
from cost_models.blocks import HEAD, CostEnv
from cost_models.calibrate import RunRecord, calibrate, read_runs
from cost_models.efficiency import DEFAULT_EFFICIENCY
from cost_models.profile import (
    BlockShape,
    BlockTime,
    CollectiveFit,
    CollectiveTime,
    Profile,
    ProfileDevice,
    load_profile,
    profile_json,
)
from topologies import Cluster, resolve_cluster_spec
from topologies.errors import InputError

MODEL = resolve_model("llama3-8b")
TRAINING = TrainingSpec(seq_len=2048, global_batch=32)
LAYOUT = ParallelLayout(tp=2, dp=4, micro_batch=1, global_batch=32)  # 16 micro-batches per replica
CLUSTER = Cluster(spec=resolve_cluster_spec("dgx-h100"), num_gpus=8)
DEVICE = ProfileDevice(
    kind="cuda", name="NVIDIA H100 80GB HBM3", gpu="H100-SXM", count=8, cores=64, memory_bytes=80 * 2**30,
    backend="nccl", torch_version="2.13.0",
)  # fmt: skip


def shape(kind="layer", tp=2, seq_len=2048) -> BlockShape:
    m = MODEL
    return BlockShape(
        kind=kind, hidden=m.hidden_size, heads=m.num_heads, kv_heads=m.num_kv_heads, head_dim=m.head_dim,
        ffn=m.ffn_hidden_size, vocab=m.vocab_size, tp=tp, seq_len=seq_len,
    )  # fmt: skip


def profile(layer_s=(1e-3, 2e-3), sizes=(1,), fits=(), **kw) -> Profile:
    blocks = [
        BlockTime(shape=shape(), micro_batch=b, fwd_s=layer_s[0] * b, bwd_s=layer_s[1] * b, samples=5) for b in sizes
    ]
    blocks += [
        BlockTime(shape=shape(k), micro_batch=1, fwd_s=1e-4, bwd_s=2e-4, samples=5) for k in ("embedding", "head")
    ]
    return Profile(
        created=datetime(2026, 12, 1, tzinfo=UTC), device=DEVICE, dtype="bfloat16", blocks=tuple(blocks),
        collective_fits=tuple(fits), **kw,
    )  # fmt: skip


def estimate(p: Profile | None, layout=LAYOUT):
    return estimate_step(MODEL, TRAINING, layout, CLUSTER, DEFAULT_EFFICIENCY.with_profile(p))


def test_a_block_measured_twice_as_slow_doubles_in_the_estimate():
    one, two = estimate(profile((1e-3, 2e-3))), estimate(profile((2e-3, 4e-3)))
    m, layers = LAYOUT.num_micro_batches, MODEL.num_layers
    # compute = micro-batches x (every layer's forward + backward + embedding + head); only layers changed
    assert two.time_breakdown_s["compute"] - one.time_breakdown_s["compute"] == pytest.approx(m * layers * 3e-3)
    assert one.time_breakdown_s["compute"] == pytest.approx(m * (layers * 3e-3 + 2 * 3e-4))
    # every block is measured; no collective fits were given, so the collectives are analytical and say so
    assert one.notes == [
        "all_reduce on 2 ranks was not profiled: analytical time",
        "all_reduce on 4 ranks was not profiled: analytical time",
    ]


def test_profile_replaces_only_what_it_measured():
    analytic = CostEnv(MODEL, TRAINING, LAYOUT, CLUSTER)
    env = CostEnv(MODEL, TRAINING, LAYOUT, CLUSTER, DEFAULT_EFFICIENCY.with_profile(profile()))
    layer = MODEL.layer_kind(0)
    assert (env.block_pass(layer, 2).fwd, env.block_pass(layer, 2).bwd) == (1e-3, 2e-3)
    assert env.block_pass(layer, 1).fwd == analytic.block_pass(layer, 1).fwd  # tp 1 was not measured
    assert any("layer at tp 1" in n and "not profiled" in n for n in env.notes)


def test_measured_collective_fit_sets_tp_communication():
    fit = CollectiveFit(op="all_reduce", group_size=2, alpha_s=5e-5, bw_bytes_per_s=1e11, max_rel_residual=0.01)
    env = CostEnv(MODEL, TRAINING, LAYOUT, CLUSTER, DEFAULT_EFFICIENCY.with_profile(profile(fits=[fit])))
    head = env.block_pass(HEAD, 2)
    # one all-reduce of the head's bf16 activation: tokens x hidden x 2 bytes (sequence parallelism off)
    assert head.tp_comm == pytest.approx(5e-5 + 2048 * MODEL.hidden_size * 2 / 1e11)


def test_interpolation_and_extrapolation_between_measured_micro_batches():
    p = profile(sizes=(1, 4))
    s = shape()
    assert p.block_time(s, 2) == pytest.approx((2e-3, 4e-3))  # on the line through (1, 1 ms) and (4, 4 ms)
    assert p.block_time(s, 8) is None
    assert p.block_time(s, 8, extrapolate=True) == pytest.approx((8e-3, 16e-3))
    uneven = Profile(
        created=p.created, device=DEVICE, dtype="bfloat16",
        blocks=(BlockTime(shape=s, micro_batch=2, fwd_s=3e-3, bwd_s=5e-3, samples=3),
                BlockTime(shape=s, micro_batch=4, fwd_s=5e-3, bwd_s=9e-3, samples=3)),
    )  # fmt: skip
    assert uneven.block_time(s, 3) == pytest.approx((4e-3, 7e-3))
    assert uneven.block_time(s, 1, extrapolate=True) == pytest.approx((2e-3, 3e-3))  # the line: 1 ms fixed + 1 ms each
    assert uneven.block_time(shape(tp=4), 2, extrapolate=True) is None  # another degree: not this shape


def test_micro_batch_between_measured_sizes_in_the_estimate():
    lay = LAYOUT.model_copy(update={"micro_batch": 2})
    got = estimate(profile(sizes=(1, 4)), lay)
    assert not any("layer" in n for n in got.notes)
    assert got.time_breakdown_s["compute"] == pytest.approx(lay.num_micro_batches * MODEL.num_layers * 6e-3, rel=0.02)


def test_a_profile_of_another_gpu_is_refused():
    a100 = Cluster(spec=resolve_cluster_spec("dgx-a100"), num_gpus=8)
    with pytest.raises(InputError, match="measured on NVIDIA H100 80GB HBM3 .H100-SXM. but the cluster's GPU is A100"):
        estimate_step(MODEL, TRAINING, LAYOUT, a100, DEFAULT_EFFICIENCY.with_profile(profile()))


def test_schema_round_trip_and_bad_files(tmp_path):
    p = profile(sizes=(1, 2, 4))
    path = tmp_path / "p.json"
    path.write_text(profile_json(p))
    assert load_profile(path) == p
    data = json.loads(path.read_text())
    data["schema_version"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="schema_version 7, not 1"):
        load_profile(path)
    data["schema_version"] = 1
    data["blocks"][0]["fwd_s"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"blocks.0.fwd_s: must lie in 0..3,600 s"):
        load_profile(path)
    path.write_text('{"schema_version": 1, "created": "yesterday"}')
    with pytest.raises(InputError, match="profile .*: created"):
        load_profile(path)


def _run(name, compute, comm, a=1.3, b=0.7, c=0.004, p=None):
    p = p or profile()
    return RunRecord(
        name=name, profile_created=p.created, profile_gpu=p.device.gpu, measured_step_time_s=a * compute + b * comm + c,
        predicted_step_time_s=compute + comm, compute_s=compute, comm_s=comm, overhead_s=0.0,
    )  # fmt: skip


def test_calibration_recovers_known_constants(tmp_path):
    runs = [_run(f"r{i}", x, y) for i, (x, y) in enumerate([(0.02, 0.01), (0.05, 0.002), (0.01, 0.03), (0.08, 0.04)])]
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(r.model_dump_json() for r in runs) + "\n\n")
    fitted = calibrate(profile(), read_runs(path)).calibration
    assert fitted.compute_scale == pytest.approx(1.3, rel=1e-6)
    assert fitted.comm_scale == pytest.approx(0.7, rel=1e-6)
    assert fitted.step_overhead_s == pytest.approx(0.004, rel=1e-5)
    assert max(abs(r.residual) for r in fitted.runs) < 1e-6
    # the calibrated profile carries its overhead into the cost model
    assert DEFAULT_EFFICIENCY.with_profile(calibrate(profile(), runs)).step_overhead_s == pytest.approx(0.004, rel=1e-5)


def test_calibration_refuses_too_few_runs_and_another_profile(tmp_path):
    with pytest.raises(InputError, match="needs at least 3 runs; got 2"):
        calibrate(profile(), [_run("a", 0.1, 0.1), _run("b", 0.2, 0.1)])
    other = profile().model_copy(update={"created": datetime(2025, 1, 1, tzinfo=UTC)})
    runs = [_run("a", 0.1, 0.1), _run("b", 0.2, 0.1), _run("c", 0.3, 0.1, p=other)]
    with pytest.raises(InputError, match="'c' was predicted with another profile"):
        calibrate(profile(), runs)
    path = tmp_path / "runs.jsonl"
    path.write_text('{"name": "x"}\nnot json\n')
    with pytest.raises(InputError, match="line 1: profile_created"):
        read_runs(path)


def _executor_env(sp: bool, dp: int = 1):
    fits = [
        CollectiveFit(op=op, group_size=g, alpha_s=a, bw_bytes_per_s=1e9, max_rel_residual=0.0)
        for op, a in (("all_reduce", 4e-4), ("all_gather", 1e-4), ("reduce_scatter", 2e-4))
        for g in (2, 4)
    ]
    eff = DEFAULT_EFFICIENCY.with_profile(profile(fits=fits), runtime="executor")
    lay = ParallelLayout(tp=2, dp=dp, micro_batch=1, global_batch=16 * dp, sequence_parallel=sp)
    return CostEnv(MODEL, TRAINING, lay, CLUSTER, eff)


def test_executor_runtime_pays_each_synchronous_collective():
    act = 2048 * MODEL.hidden_size * 2  # one micro-batch's activation on the wire, bf16 profile
    layer = MODEL.layer_kind(0)
    plain = _executor_env(sp=False).block_pass(layer, 2)
    # two all-reduces forward (attention and MLP outputs), two backward (their inputs' gradients), none hidden
    assert plain.tp_comm == pytest.approx(4 * (4e-4 + act / 1e9))
    sp = _executor_env(sp=True).block_pass(layer, 2)
    # under sequence parallelism each of the four is an all-gather and a reduce-scatter, each its own call
    assert sp.tp_comm == pytest.approx(4 * (1e-4 + 2e-4 + 2 * act / 1e9))


def test_executor_runtime_reduces_gradients_one_tensor_at_a_time():
    from cost_models.step import layout_stages

    env = _executor_env(sp=False, dp=4)
    (stage,) = layout_stages(env)
    params = stage.params
    calls = MODEL.num_layers * 9 + 1 + 2  # nine tensors per layer, the embedding, the final norm and LM head
    assert stage.dp.reduce_s == pytest.approx(calls * 4e-4 + params * TRAINING.grad_bytes / 1e9)


def test_notes_survive_pass_caches_shared_by_a_search():
    from ntp_planner.solver.planner import make_plan

    eff = DEFAULT_EFFICIENCY.with_profile(profile())
    plan = make_plan(MODEL, TRAINING, CLUSTER, efficiency=eff, top=1)
    fresh = estimate_step(MODEL, TRAINING, plan.layout, CLUSTER, eff)
    assert plan.predicted.notes == fresh.notes and fresh.notes


def test_a_collective_across_domains_is_noted():
    two_hosts = Cluster(spec=resolve_cluster_spec("dgx-h100"), num_gpus=16)
    lay = ParallelLayout(tp=2, dp=8, micro_batch=1, global_batch=32)
    cost = estimate_step(MODEL, TRAINING, lay, two_hosts, DEFAULT_EFFICIENCY.with_profile(profile()))
    assert "all_reduce on 8 ranks spans 2 NVLink domains: analytical time" in cost.notes


def test_a_shape_measured_twice_or_in_no_time_is_refused():
    p = profile(sizes=(1, 2))
    with pytest.raises(ValueError, match="blocks.1 measures layer at tp 2, 1 x 2048 tokens a second time"):
        Profile.model_validate(p.model_dump() | {"blocks": [p.blocks[0].model_dump(), p.blocks[0].model_dump()]})
    with pytest.raises(ValueError, match="must be above 0 s, not 0"):
        CollectiveTime(op="all_reduce", group_size=2, bytes=1024, time_s=0.0)


def test_calibration_refuses_runs_of_a_calibrated_profile_and_runs_that_cannot_separate_the_terms():
    runs = [_run(f"r{i}", x, y) for i, (x, y) in enumerate([(0.02, 0.01), (0.05, 0.002), (0.01, 0.03)])]
    calibrated = calibrate(profile(), runs)
    with pytest.raises(InputError, match="'r0' was predicted with another profile .* multipliers 1 and 1"):
        calibrate(calibrated, runs)  # the multipliers would apply twice
    no_comm = [_run(f"r{i}", x, 0.0) for i, x in enumerate([0.01, 0.02, 0.04])]
    with pytest.raises(InputError, match="cannot tell compute, communication and a fixed overhead apart"):
        calibrate(profile(), no_comm)
