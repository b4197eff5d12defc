"""The step-time model against published measurements (calibration.md tables A-D, tables E-F).

Every row of tables A-D goes through `ntp estimate --json`, as a user would run it: each table's
mean error must stay within 5% and every row within 12% (the calibration goal), and every layout
of tables C and D, which ran, must fit in memory. The derived step times are checked against the
published columns, and the published TFLOP/s against our FLOP count, which pins the model shapes.
"""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cost_models.flops import model_flops_per_step
from cost_models.pipeline_layout import format_layout
from cost_models.published import TABLE_A, TABLE_B, TABLE_B_STRONG, TABLE_C, TABLE_D, all_tables
from cost_models.step import estimate_step
from ntp_planner.cli import app

MEAN_BOUND, ROW_BOUND = 0.05, 0.12


def model_arg(row, tmp_path) -> str:
    """A catalogue name, or for table B's README models a config.json with their shape."""
    m = row.model
    if not m.name.startswith("megatron-h100"):
        return m.name
    path = tmp_path / m.name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_heads,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "attention_dropout": m.dropout,
    }
    path.write_text(json.dumps(config))
    return str(path)


def estimate_args(row, tmp_path) -> list[str]:
    """`ntp estimate` arguments that describe the row's training and layout completely."""
    lay, tr = row.layout, row.training
    args = ["estimate", "-m", model_arg(row, tmp_path), "-c", row.cluster_name, "-n", str(row.gpus)]
    args += ["--tp", str(lay.tp), "--pp", str(lay.pp), "--cp", str(lay.cp), "--vpp", str(lay.vpp)]
    args += ["--micro-batch", str(lay.micro_batch), "--recompute", lay.recompute, "--zero", str(lay.zero)]
    args += ["--seq-len", str(tr.seq_len), "--global-batch", str(tr.global_batch), "--dtype", tr.dtype]
    args += ["--fp8-recipe", tr.fp8_recipe, "--grad-reduce", "fp32" if tr.grad_bytes == 4 else "bf16"]
    args += ["--attention-kernel", tr.attention_kernel]
    if lay.chunk_layers is not None:
        args += ["--pp-layout", format_layout(lay.chunk_layers, lay.pp)]
    args += ["--sequence-parallel" if lay.sequence_parallel else "--no-sequence-parallel"]
    switches = [
        ("--tp-comm-overlap", lay.tp_comm_overlap),
        ("--fp8-params", tr.fp8_params),
        ("--precision-aware-optimizer", tr.precision_aware_optimizer),
        ("--unfused-cross-entropy", not tr.fused_cross_entropy),
        ("--no-flash-attention", not tr.flash_attention),
        ("--no-overlap-grad-reduce", not lay.overlap_grad_reduce),
        ("--no-overlap-p2p", not lay.overlap_p2p),
        ("--p2p-scatter-gather", lay.p2p_scatter_gather),
    ]
    return args + [flag for flag, on in switches if on] + ["--json"]


@pytest.fixture(scope="module")
def predictions(tmp_path_factory):
    """Every row of tables A-D through the CLI: (table, row, StepCost JSON)."""
    tmp = tmp_path_factory.mktemp("models")
    runner = CliRunner()
    out = []
    for table, rows in (("A", TABLE_A), ("B", TABLE_B), ("C", TABLE_C), ("D", TABLE_D)):
        for row in rows:
            result = runner.invoke(app, estimate_args(row, tmp))
            assert result.exit_code == 0, (row.model.name, result.output)
            out.append((table, row, json.loads(result.stdout)))
    return out


@pytest.mark.parametrize("table", ["A", "B", "C", "D"])
def test_table_within_the_calibration_goal(predictions, table):
    errors = {
        row.model.name + " " + row.layout.describe(): cost["step_time_s"] / row.measured_step_time_s - 1
        for t, row, cost in predictions
        if t == table
    }
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= ROW_BOUND, f"{worst}: {errors[worst]:+.1%}"
    assert np.mean(np.abs(list(errors.values()))) <= MEAN_BOUND, errors


def test_the_cli_predicts_what_the_library_does(predictions):
    table, row, cost = predictions[-1]
    direct = estimate_step(row.model, row.training, row.layout, row.cluster)
    assert cost["step_time_s"] == pytest.approx(direct.step_time_s, rel=1e-12)


@pytest.mark.parametrize("table", ["C", "D"])
def test_layouts_that_ran_fit_in_memory(predictions, table):
    for t, row, cost in predictions:
        if t == table:
            assert cost["memory_per_gpu_bytes"] <= cost["hbm_bytes"], (row.model.name, row.layout.describe())


# Tables the goal does not name, fitted together with A-D (benchmarks/fit_efficiency.py): bounds
# a little above today's errors (B-strong 5.4% / 8.0%, E 4.7% / 13.3%, F 5.7% / 17.0%), so a change
# that makes them worse fails. B-strong runs the Megatron-LM README's 2024 stack, which trains bf16
# on H100 about 10% slower than NeMo's recipes of table F, and one set of constants splits the
# difference; F's worst rows are NeMo 1 runs with the FlashAttention-2 package at 8k tokens.
OTHER_BOUNDS = {"B-strong": (0.06, 0.10), "E": (0.05, 0.15), "F": (0.065, 0.19)}


@pytest.mark.parametrize("name", sorted(OTHER_BOUNDS))
def test_other_published_tables_stay_close(name):
    mean_bound, row_bound = OTHER_BOUNDS[name]
    errors = [
        estimate_step(r.model, r.training, r.layout, r.cluster).step_time_s / r.measured_step_time_s - 1
        for r in all_tables()[name]
    ]
    assert np.max(np.abs(errors)) <= row_bound
    assert np.mean(np.abs(errors)) <= mean_bound


def test_strong_scaling_loses_mfu_with_scale():
    strong = [estimate_step(r.model, r.training, r.layout, r.cluster) for r in TABLE_B_STRONG]
    mfu = [c.mfu for c in strong]
    measured_drop = (464 - 416) / 989  # 96 -> 4,608 GPUs, the README's plot: about 4.9 MFU points
    assert mfu[0] - mfu[-1] > 0.5 * measured_drop and all(a >= b for a, b in zip(mfu, mfu[1:], strict=False))


def test_fp8_speed_up_follows_the_same_layout_pairs():
    """Table F runs each model and layout in bf16 and in fp8 on one software stack: the model's
    fp8 / bf16 speed-up must follow the measured one (1.29-1.61 on H100, 1.44-1.53 on GB200), not
    the 2x of the peaks. Today it is 6% high on average (worst pair 17%)."""
    pairs: dict[tuple, dict[str, object]] = {}
    for r in all_tables()["F"]:
        key = (r.source, r.cluster_name, r.model.name, r.gpus, r.training.global_batch, r.layout.describe())
        pairs.setdefault(key, {})[r.training.dtype] = r
    errors = []
    for both in pairs.values():
        if len(both) < 2:
            continue
        bf16, fp8 = both["bf16"], both["fp8"]
        measured = bf16.measured_step_time_s / fp8.measured_step_time_s
        ours = (
            estimate_step(bf16.model, bf16.training, bf16.layout, bf16.cluster).step_time_s
            / estimate_step(fp8.model, fp8.training, fp8.layout, fp8.cluster).step_time_s
        )
        assert 1.2 < ours < 1.75, (bf16.model.name, bf16.source)
        errors.append(ours / measured - 1)
    assert len(errors) >= 80
    assert np.mean(np.abs(errors)) <= 0.08 and np.max(np.abs(errors)) <= 0.2


def test_measured_times_match_the_published_derivation():
    # calibration.md lists the derived iteration times; our derivations must agree.
    published = {
        "A": [3.53, 3.70, 3.70, 9.40, 14.45, 16.06, 24.82, 37.61, 54.08, 102.63],
        "C": [2.91, 1.40, 5.64, 10.48, 3.89, 3.79, 4.80, 1.29, 3.85, 3.18, 10.89, 10.69],
        "D": [9.07, 10.2, 14.0, 19.7, 37.7],
    }
    tables = {"A": TABLE_A, "C": TABLE_C, "D": TABLE_D}
    for name, times in published.items():
        for row, t in zip(tables[name], times, strict=True):
            assert row.measured_step_time_s == pytest.approx(t, rel=0.01), (name, row.model.name)


def test_table_b_rows_are_the_published_mfu():
    # Table B's derived iteration time reproduces the published MFU column: TFLOP/s / 989.
    mfu = [0.41, 0.47, 0.49, 0.46, 0.42, 0.43, 0.44, 0.48, 0.47]
    for row, m in zip(TABLE_B, mfu, strict=True):
        flops = model_flops_per_step(row.model, row.training.seq_len, row.training.global_batch)
        assert flops / (row.measured_step_time_s * row.gpus * 989e12) == pytest.approx(m, abs=0.006)


@pytest.mark.parametrize(
    ("table", "tflops", "causal"),
    [
        ("C", [736, 750, 782, 842, 776, 754, 759, 653, 554, 678, 697, 738], False),
        ("D", [744, 719, 737, 731, 822], True),
    ],
)
def test_published_tflops_match_our_flop_count(table, tflops, causal):
    # Megatron-Bridge 26.04.01 rounded its tokens/s (to multiples of 32-64): 2.5% there.
    """TFLOP/s = FLOPs per step / (step time x GPUs): with the step time derived from tokens/s,
    the published TFLOP/s pins each model's shape (NeMo 24.07 counts full attention, Megatron-
    Bridge causal)."""
    rows = {"C": TABLE_C, "D": TABLE_D}[table]
    for row, published in zip(rows, tflops, strict=True):
        flops = model_flops_per_step(row.model, row.training.seq_len, row.training.global_batch, causal=causal)
        ours = flops / (row.measured_step_time_s * row.gpus) / 1e12
        assert ours == pytest.approx(published, rel=0.025 if "26.04.01" in row.source else 0.01), row.model.name
