"""GPT- and Nemotron-style blocks and selective recompute in the executor, exact against the
single-process reference in float64 (gloo, one watchdog per run as in test_runtime).

GPT blocks: LayerNorm with a bias, 2-matrix GELU MLP, biases on every linear layer (column-parallel
ones cut like their rows, row-parallel ones added once after the TP sum), learned positions.
"""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.model import reference as model  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.launch import launch  # noqa: E402
from tests.support.mutations import plant  # noqa: E402

GPT = TinyConfig(norm="layer", mlp="gelu", bias=True, positions="learned", max_positions=16)
# with learned positions the key bias has no gradient (``model.zero_gradient_params``); rotated,
# it has one: the cut-KV-head test runs GPT blocks with rotary positions so the K bias counts
GPT_ROTARY = TinyConfig(norm="layer", mlp="gelu", bias=True)
TOL = 1e-9  # float64


def assert_exact(result):
    assert result.max_rel_error_loss <= TOL
    assert result.max_rel_error_grads <= TOL
    assert result.max_rel_error_params <= TOL
    assert result.losses[2] < result.losses[0]  # it trained
    return result


def run(cfg, *args, worker_init=None, **kw):
    return launch(make_spec(cfg, *args, dtype="float64", **kw), timeout_s=120, worker_init=worker_init)


@pytest.fixture(scope="module")
def tp2_runs():
    """GPT blocks at TP2, without and with selective recompute (2 micro-batches of 2)."""
    return {rc: assert_exact(run(GPT, [[2, 2, 2, 2]], [([2], 2)], 2, 8, recompute=rc)) for rc in ("none", "selective")}


@pytest.mark.timeout(240)
def test_gpt_blocks_at_tp2_are_exact(tp2_runs):
    assert tp2_runs["none"].losses == pytest.approx(tp2_runs["selective"].losses, rel=1e-12)


@pytest.mark.timeout(240)
def test_selective_recompute_is_exact_and_keeps_less(tp2_runs):
    # CPU's fused attention saves q, k, v, its output and the softmax's log-sum-exp. Selective
    # recompute keeps q, k, v (the checkpoint's inputs) and the output (the output projection
    # saves it anyway) and drops the log-sum-exp: 2 sequences x 4 heads (of 8, TP2) x 8 tokens
    # in float64 = 512 bytes per layer, 2 layers
    none, selective = (tp2_runs[rc].memory_bytes[0]["activations_peak"] for rc in ("none", "selective"))
    assert none - selective == 2 * (2 * 4 * 8 * 8), (none, selective)


def test_selective_recompute_runs_the_core_attention_again_in_backward(monkeypatch):
    calls = []
    real = model.core_attention
    monkeypatch.setattr(model, "core_attention", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    o = torch.randn(6, 8, generator=g, dtype=torch.float64)
    grads = []
    for recompute, expected in ((False, [1, 1]), (True, [1, 2])):  # calls after forward, after backward
        calls.clear()
        out = model.attend(q, k, v, [0, 1], o, recompute=recompute)
        seen = [len(calls)]
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
        assert [*seen, len(calls)] == expected
    for plain, recomputed in zip(*grads, strict=True):
        torch.testing.assert_close(recomputed, plain, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_gpt_blocks_ntp_tp3_beside_tp2_with_cut_kv_heads_and_their_biases():
    # TP3 deals 8 heads 3/3/2 over 2 KV heads: both KV heads (and their K/V biases) live on two
    # ranks and sum their gradients there; the NTP sync reshards every cut bias between TP3 and
    # TP2 and sums the replicated ones (row-parallel biases, LayerNorms) 1:1
    assert_exact(run(GPT_ROTARY, [[3, 3, 3, 3]], [([3], 2), ([2], 2)], 2, 8))


@pytest.mark.timeout(240)
def test_gpt_blocks_with_sequence_parallelism_at_uneven_tp3():
    # 8 tokens cut 3/3/2: each rank adds the learned positions of its piece; the row-parallel
    # biases, LayerNorm weights and biases and the position table sum their gradients over TP
    assert_exact(run(GPT, [[3, 3, 3, 3]], [([3], 1)], 1, 8, sequence_parallel=True, width=3))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_gpt_blocks_with_cp2_and_sequence_parallelism():
    # 9 tokens: cp chunks 5/4 hold positions 0-4 and 5-8, each cut 3/2 and 2/2 over TP2
    assert_exact(run(GPT, [[2, 2, 2, 2]], [([2], 2)], 2, 9, cp=2, sequence_parallel=True))


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(240)
def test_nemotron_blocks_at_tp2_with_full_recompute():
    nemotron = TinyConfig(norm="layer", mlp="relu2")  # squared ReLU, LayerNorm, rotary, no biases
    assert_exact(run(nemotron, [[2, 2, 2, 2]], [([2], 2)], 2, 8, recompute="full"))


@pytest.mark.timeout(240)
def test_a_row_parallel_bias_added_on_every_tp_rank_is_caught(monkeypatch):
    result = run(GPT, [[2, 2, 2, 2]], [([2], 2)], 2, 8, worker_init=plant(monkeypatch, "row-bias-twice"))
    assert result.max_rel_error_loss > 1e-4 and result.max_rel_error_grads > 1e-3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_validate_a_gpt_plan_with_selective_recompute_end_to_end(tmp_path):
    import json

    from typer.testing import CliRunner

    from ntp_planner.cli import app

    runner = CliRunner()
    common = ["-m", "gpt3-5b", "-c", "dgx-h100", "--seq-len", "2048", "-n", "8", "--tp", "2", "--pp", "2"]
    plan = tmp_path / "gpt.json"
    args = ["estimate", *common, "--global-batch", "8", "--recompute", "selective", "-o", str(plan)]
    assert runner.invoke(app, args).exit_code == 0
    r = runner.invoke(app, ["validate", str(plan), "--nproc", "4", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] and max(out["max_rel_error_loss"], out["max_rel_error_grads"]) <= 1e-5
    assert any("gpt blocks kept" in n and "selective recompute kept" in n for n in out["notes"]), out["notes"]
