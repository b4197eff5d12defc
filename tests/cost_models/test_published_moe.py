"""Table G (cost_models/published_moe.py): the MoE runs of the Megatron-Bridge performance
summaries, as collected from their git history, each built into a valid layout or listed with the
reason it cannot be."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from cost_models import published_moe as g
from cost_models.layout import check_layout
from cost_models.published import all_tables

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import calibration  # noqa: E402

# Runs collected per model and release (each release's last version; a run reprinted unchanged by a
# later release counted there only: Qwen3-235B GB300 26.02 -> 26.02.01, Qwen3-30B GB300 26.06.01
# -> 26.08). 25.09's mxfp8 alternatives in parentheses count as runs of their own.
PER_RELEASE = {
    "deepseek-v3": {
        "25.09": 5,
        "25.11": 5,
        "26.02": 4,
        "26.02.01": 4,
        "26.04": 4,
        "26.04.01": 4,
        "26.06": 4,
        "26.06.01": 2,
        "26.08": 2,
    },
    "gpt-oss-120b": {
        "25.11": 4,
        "26.02": 5,
        "26.02.01": 5,
        "26.04": 5,
        "26.04.01": 5,
        "26.06": 3,
        "26.06.01": 2,
        "26.08": 2,
    },
    "qwen3-235b-a22b": {
        "25.09": 5,
        "25.11": 4,
        "26.02": 4,
        "26.02.01": 4,
        "26.04": 4,
        "26.04.01": 5,
        "26.06": 2,
        "26.06.01": 2,
        "26.08": 2,
    },
    "qwen3-30b-a3b": {
        "25.09": 4,
        "25.11": 4,
        "26.02": 5,
        "26.02.01": 5,
        "26.04": 5,
        "26.04.01": 5,
        "26.06": 4,
        "26.06.01": 1,
        "26.08": 2,
    },
}
COLLECTED = {"deepseek-v3": 34, "gpt-oss-120b": 31, "qwen3-235b-a22b": 32, "qwen3-30b-a3b": 35}
_KEY = ("release", "system", "format", "gpus", "batch", "mb", "seq", "tp", "pp", "cp", "vp", "ep", "tokens")


def _entries():
    for name, runs in g._G.items():
        for run in runs:
            yield name, dict(zip(_KEY, run, strict=False))


def test_row_count_per_model_is_what_was_collected():
    assert Counter(name for name, _ in _entries()) == COLLECTED
    assert {n: dict(Counter(e["release"] for m, e in _entries() if m == n)) for n in COLLECTED} == PER_RELEASE
    assert {n: sum(c.values()) for n, c in PER_RELEASE.items()} == COLLECTED
    rows, excluded = g.build()
    built = Counter(r.model.name for r in rows) + Counter(x.model for x in excluded)
    assert built == COLLECTED


def test_every_release_of_the_history_is_in_the_table():
    assert {e["release"] for _, e in _entries()} == set(g.RECIPE_TAGS)


def test_no_run_is_repeated():
    """A run reprinted unchanged by a later release is kept once; two rows of one release are
    different runs."""
    runs = [(name, *(e[k] for k in _KEY[1:])) for name, e in _entries()]
    assert len(runs) == len(set(runs))
    per_release = [(name, *(e[k] for k in _KEY[:-1])) for name, e in _entries()]
    assert len(per_release) == len(set(per_release))


def test_step_time_from_tokens_matches_hand_arithmetic():
    # DeepSeek-V3, 26.08, 256 GB300, GBS 4096 x 4096 tokens at 6,288 tokens/s/GPU:
    # 16,777,216 tokens / (6,288 * 256 = 1,609,728 tokens/s) = 10.4224 s
    assert g.tokens_to_step_time_s(4096, 4096, 256, 6288) == pytest.approx(10.4224, abs=1e-4)
    # Qwen3-30B-A3B, 26.08, 8 GB300, GBS 512 x 4096 at 44,544: 2,097,152 / 356,352 = 5.88506 s
    assert g.tokens_to_step_time_s(512, 4096, 8, 44544) == pytest.approx(5.88506, abs=1e-5)
    dsv3 = [e for n, e in _entries() if n == "deepseek-v3" and e["release"] == "26.08" and e["system"] == "GB300"]
    qwen = [e for n, e in _entries() if n == "qwen3-30b-a3b" and e["release"] == "26.08" and e["system"] == "GB300"]
    assert [e["tokens"] for e in dsv3] == [6288] and [e["tokens"] for e in qwen] == [44544]


def test_built_rows_carry_the_measured_step_time():
    data = {(name, *(e[k] for k in _KEY[:-1])): e for name, e in _entries()}
    for r in g.table_g():
        lay, t = r.layout, r.training
        fmt = "fp8-cs" if t.dtype == "fp8" else t.dtype
        key = (r.model.name, r.release, r.system, fmt, r.gpus, t.global_batch, lay.micro_batch, t.seq_len)
        key += (lay.tp, lay.pp, lay.cp, lay.vpp, lay.ep)
        e = data[key]
        assert r.measured_step_time_s * e["tokens"] * e["gpus"] == pytest.approx(e["batch"] * e["seq"])


def test_every_run_is_valid_as_printed_or_listed_with_its_reason():
    rows, excluded = g.build()
    for r in rows:
        check_layout(r.layout, r.model, r.training, r.gpus, r.cluster.tp_domain_size)
        assert r.layout.expert_tp == 1 and r.layout.world_size == r.gpus
    assert all(x.reason for x in excluded)
    assert len(rows) + len(excluded) == sum(COLLECTED.values())
    assert all_tables()["G"] == list(rows)


def test_only_the_run_that_cannot_exist_is_left_out():
    """25.09's GB200 mxfp8 alternative prints pp 8 (in parentheses) beside the fp8 run's ep 64: 256
    GPUs / 8 stages = 32 a stage, which 64 expert ranks cannot tile. Every other run builds."""
    (left,) = g.excluded_g()
    assert (left.model, left.release, left.system) == ("deepseek-v3", "25.09", "GB200")
    assert "pp8" in left.description and "ep64" in left.description and "does not divide" in left.reason


def test_userbuffers_only_where_the_recipe_sets_them():
    overlap = {(r.model.name, r.release, r.system) for r in g.table_g() if r.layout.tp_comm_overlap}
    assert overlap == {("qwen3-235b-a22b", "25.09", "GB200"), ("qwen3-235b-a22b", "25.09", "H100")}


def test_calibration_lists_the_runs_left_out():
    lines = calibration.excluded_lines("G")
    excluded = g.excluded_g()
    assert len(lines) == (len(excluded) + 2 if excluded else 0)
    assert "G" in calibration.TITLES and calibration.MODULES["G"] is g
    assert "expert tensor parallelism 1" in calibration.settings("G")


def test_deepseek_pipeline_layouts_hold_61_layers():
    """The recipe's 2 x 8 layout and set_deepseek_v3_pipeline_model_parallel_layout's splits, by
    hand: 16 chunks of 4 layers but the last (1, with MTP and the loss); 8 chunks of 8 but the last
    (5); 4 chunks 16/16/16/13; the 25.09 H100 layout: 1, then 30 chunks of 2, then MTP and loss."""
    model = SimpleNamespace(name="deepseek-v3", num_layers=61)
    assert g._chunks(model, 2, 8, g._pipeline("deepseek-v3", 2, 8, None, 1)) == (4,) * 15 + (1,)
    assert g._chunks(model, 8, 1, g._pipeline("deepseek-v3", 8, 1, None, 1)) == (8,) * 7 + (5,)
    assert g._chunks(model, 4, 1, g._pipeline("deepseek-v3", 4, 1, None, 1)) == (16, 16, 16, 13)
    assert g._chunks(model, 8, 4, g._pipeline("deepseek-v3", 8, 4, None, 1)) == (1,) + (2,) * 30 + (0,)
    assert g._pipeline("deepseek-v3", 2, 4, None, 0) == "Et*8|(t*8|)*6t*5L"  # 25.11 without MTP


def test_qwen3_235b_counts_embedding_and_loss_as_layers():
    """94 layers + embedding + loss = 96 slots: pp 4 x vp 12 gives 48 chunks of 2, the first and
    last holding one layer; pp 8 x vp 3, 24 chunks of 4 (3 in the first and last)."""
    model = SimpleNamespace(name="qwen3-235b-a22b", num_layers=94)
    assert g._chunks(model, 4, 12, None) == (1,) + (2,) * 46 + (1,)
    assert g._chunks(model, 8, 3, None) == (3,) + (4,) * 22 + (3,)
    assert g._chunks(SimpleNamespace(name="qwen3-30b-a3b", num_layers=48), 2, 12, None) is None


def test_recipe_settings_per_era():
    """Spot checks against the recipes: 25.09 H100 DeepSeek-V3 runs DeepEP with the 1F1B overlap
    and recomputes MLA up-projections and the MLP; the 25.09 Qwen3 runs drop tokens; 26.06 GB300
    runs full-iteration graphs with HybridEP and the overlap."""
    by = {
        (n, e["release"], e["system"], e["format"], e["batch"]): run
        for n, runs in g._G.items()
        for run in runs
        for e in [dict(zip(_KEY, run, strict=False))]
    }
    assert by[("deepseek-v3", "25.09", "H100", "fp8-cs", 8192)][13:] == ("deepep", True, "mla+mlp", g._S32, "")
    assert by[("qwen3-30b-a3b", "25.09", "H100", "fp8-cs", 512)][-1] == "drop"
    assert by[("qwen3-235b-a22b", "26.06", "GB300", "mxfp8", 8192)][13:15] == ("hybridep", True)
    assert by[("deepseek-v3", "25.11", "GB300", "bf16", 4096)][-1] == "no-mtp"


def test_qwen3_30b_h100_rows_take_their_releases_recipe():
    """25.11 and 26.02.01 print the layout cells of the release before (25.09's MBS 2 / VP 24, 26.02's
    PP 2 / VP 12 / EP 8); the rows carry their own recipe's (v0.2.2: MBS 1, VP 12; v0.3.1: EP 16, no
    pipelining), whose throughput twins are 26.02's and 26.04's runs (the module docstring)."""
    by = {e["release"]: e for n, e in _entries() if n == "qwen3-30b-a3b" and e["system"] == "H100"}
    assert [by["25.11"][k] for k in ("mb", "pp", "vp", "ep", "tokens")] == [1, 2, 12, 8, 5275]
    assert [by["26.02.01"][k] for k in ("mb", "pp", "vp", "ep", "tokens")] == [1, 1, 1, 16, 9058]
    assert [by["26.04"][k] for k in ("mb", "pp", "vp", "ep")] == [1, 1, 1, 16]  # printed so from 26.04
    assert [by["25.09"][k] for k in ("mb", "vp")] == [2, 24]  # as printed
    # per sample, 25.11 and 26.02 (both MBS 1, VP 12, the overlap): 512 x 4096 / (5,275 x 16) = 24.85 s a
    # step of 512, 48.5 ms a sample; 1,024 x 4096 / (5,113 x 16) = 51.27 s a step of 1,024, 50.1 ms
    assert g.tokens_to_step_time_s(512, 4096, 16, 5275) / 512 == pytest.approx(0.04853, abs=1e-5)
    assert g.tokens_to_step_time_s(1024, 4096, 16, 5113) / 1024 == pytest.approx(0.05007, abs=1e-5)


def test_qwen3_235b_b300_takes_hybridep_from_v0_4_2():
    """v0.4.2 (26.04.01) runs Qwen3-235B-A22B on B300 with flex / HybridEP (Megatron-Bridge #3490); 26.04's
    v0.4.0 ran the all-to-all at the same printed layout (PP 8, MBS 2, EP 8), 4,865 tokens/s/GPU against 5,936."""
    by = {
        e["release"]: run
        for n, runs in g._G.items()
        if n == "qwen3-235b-a22b"
        for run in runs
        for e in [dict(zip(_KEY, run, strict=False))]
        if e["system"] == "B300"
    }
    assert by["26.04.01"][5:12] == by["26.04"][5:12] == (2, 4096, 1, 8, 1, 1, 8)  # mb, seq, tp, pp, cp, vp, ep
    assert (by["26.04"][13], by["26.04.01"][13]) == ("a2a", "hybridep")
    assert (by["26.04"][12], by["26.04.01"][12]) == (4865, 5936)
    row = next(
        r for r in g.table_g() if r.model.name == "qwen3-235b-a22b" and r.release == "26.04.01" and r.system == "B300"
    )
    assert row.layout.moe_dispatcher == "flex" and row.moe.dispatcher_backend == "hybridep"


def test_qwen3_235b_26_02_01_runs_the_all_to_all_its_recipe_functions_set():
    # v0.3.1's base configs name DeepEP, but qwen3_235b_a22b_pretrain_config_b300 / _h100 set
    # moe_token_dispatcher_type "alltoall" after it (#2393); GB200 / GB300 stay flex with HybridEP
    rows = {r.system: r for r in g.table_g() if r.model.name == "qwen3-235b-a22b" and r.release == "26.02.01"}
    for system in ("B300", "H100"):
        assert rows[system].layout.moe_dispatcher == "alltoall" and rows[system].moe.dispatcher_backend == "alltoall"
        assert rows[system].training.moe_flex_backend is None
    assert rows["H100"].layout.moe_overlap == "1f1b" and rows["B300"].layout.moe_overlap == "none"
    for system in ("GB200", "GB300"):
        assert rows[system].layout.moe_dispatcher == "flex" and rows[system].moe.dispatcher_backend == "hybridep"


def test_table_g_stays_where_the_mechanisms_put_it():
    # issue 24 item 8 (round 6, GPT-OSS's expert-bias pass and the recipe audit, the pass left out of the
    # graphed runs' fused grouped MLP by its review): 7.88% mean, 7 runs over 20%, every run fits (the
    # goal's 8% holds, none over 20% does not: README "Mixture-of-experts");
    # bounds a little above, so a change that makes it worse fails
    from cost_models.step import estimate_step

    costs = [(r, estimate_step(r.model, r.training, r.layout, r.cluster)) for r in g.table_g()]
    errors = [abs(c.step_time_s / r.measured_step_time_s - 1) for r, c in costs]
    assert sum(errors) / len(errors) <= 0.080
    assert sum(e > 0.2 for e in errors) <= 7
    assert all(c.fits() for _, c in costs)


def test_fp8_attention_where_the_full_iteration_mxfp8_recipes_set_it():
    # fp8_dot_product_attention: every full-iteration mxfp8 recipe (26.06 on) but DeepSeek-V3's on GB200
    fp8 = {(r.model.name, r.release, r.system) for r in g.table_g() if r.training.fp8_attention}
    graphed = {(r.model.name, r.release, r.system) for r in g.table_g() if r.training.cuda_graphs}
    assert fp8 == {k for k in graphed if k[0] != "deepseek-v3" or k[2] != "GB200"}
    assert ("deepseek-v3", "26.06", "GB300") in fp8 and ("deepseek-v3", "26.06", "B300") not in fp8
    assert len(fp8) == 21  # 3 DeepSeek-V3, 6 GPT-OSS, 6 Qwen3-235B, 6 Qwen3-30B (model, release, system)
