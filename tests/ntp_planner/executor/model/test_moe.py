"""Mixture-of-experts layers: the reference against plain loops and hand numbers, expert
parallelism on gloo exact against one process (float64), a planted bug caught, and the shrink of
MoE plans (experts, top-k, MoE layers and ep kept)."""

import json
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from cost_models.catalogue import MODELS  # noqa: E402
from cost_models.layout import ParallelLayout  # noqa: E402
from cost_models.training import TrainingSpec  # noqa: E402
from ntp_planner.executor.check.predict import run_model  # noqa: E402
from ntp_planner.executor.model.moe import moe_reference, sequence_aux  # noqa: E402
from ntp_planner.executor.model.reference import Reference, rms_norm  # noqa: E402
from ntp_planner.executor.shrink.run import shrink  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.launch import launch  # noqa: E402
from ntp_planner.solver.planner import plan_from_layout  # noqa: E402
from tests.support.mutations import plant  # noqa: E402
from topologies.cluster import Cluster  # noqa: E402
from topologies.cluster_catalogue import CLUSTERS  # noqa: E402

# 4 experts of width 12, top-2, a shared expert of width 8; both layers MoE
MOE = TinyConfig(layers=2, experts=4, top_k=2, expert_ffn=12, moe_layers=(0, 1), shared_ffn=8)
TOL = 1e-9  # float64


def check(result):
    assert result.max_rel_error_loss <= TOL
    assert result.max_rel_error_grads <= TOL
    assert result.max_rel_error_params <= TOL
    assert result.losses[2] < result.losses[0]  # it trained


# ---- the reference ---------------------------------------------------------------------------
def test_reference_moe_is_a_loop_over_tokens_and_their_top_k_experts():
    torch.set_default_dtype(torch.float64)
    try:
        ref = Reference(MOE, seed=3)
        layer = ref.layers[0]
        h = rms_norm(torch.randn(2, 5, MOE.hidden), layer.norm2).detach()
        got, _ = moe_reference(h, layer, MOE)
    finally:
        torch.set_default_dtype(torch.float32)
    silu = lambda v: v / (1 + math.exp(-v))  # noqa: E731
    dot = lambda a, b: sum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731

    def mlp(x, gate, up, down):  # one token through a SwiGLU MLP, element by element
        mid = [silu(dot(g, x)) * dot(u, x) for g, u in zip(gate, up, strict=True)]
        return [dot(row, mid) for row in down]

    for b in range(2):
        for s in range(5):
            x = h[b, s].tolist()
            logits = [dot(row, x) for row in layer.router.tolist()]
            chosen = sorted(range(MOE.experts), key=lambda e: -logits[e])[: MOE.top_k]
            norm = sum(math.exp(logits[e]) for e in chosen)  # softmax over the k kept
            want = mlp(x, layer.shared_gate.tolist(), layer.shared_up.tolist(), layer.shared_down.tolist())
            for e in chosen:
                out = mlp(x, layer.expert_gate[e].tolist(), layer.expert_up[e].tolist(), layer.expert_down[e].tolist())
                want = [a + math.exp(logits[e]) / norm * o for a, o in zip(want, out, strict=True)]
            assert got[b, s].tolist() == pytest.approx(want, rel=1e-12, abs=1e-14)


def test_sequence_aux_loss_by_hand_and_over_chunks():
    # 3 experts, top-2, one sequence of 2 tokens: softmax (.5, .3, .2) picks experts 0 and 1,
    # (.2, .3, .5) picks 2 and 1. f = E / (k T) * counts = 3/4 * (1, 2, 1); P = (.35, .3, .35)
    probs = torch.tensor([[[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]], dtype=torch.float64)
    logits = probs.log()
    experts = logits.topk(2, dim=-1)[1]
    whole = sequence_aux(logits, experts, 2)
    assert whole.item() == pytest.approx(0.75 * 0.35 + 1.5 * 0.3 + 0.75 * 0.35, rel=1e-12)  # 0.975
    # context parallelism: each chunk adds the other's expert counts, and the pieces sum to L_s
    counts = [torch.nn.functional.one_hot(experts[:, i : i + 1], 3).sum((-3, -2)).double() for i in range(2)]
    pieces = [
        sequence_aux(logits[:, i : i + 1], experts[:, i : i + 1], 2, lambda c, i=i: c.add_(counts[1 - i]))
        for i in range(2)
    ]
    assert (pieces[0] + pieces[1]).item() == pytest.approx(0.975, rel=1e-12)
    # the model's loss adds aux_coeff x the mean over sequences, per MoE layer
    cfg = TinyConfig(layers=1, experts=3, top_k=2, expert_ffn=4, moe_layers=(0,), aux_coeff=0.5)
    ref = Reference(cfg)
    tokens = torch.randint(0, cfg.vocab, (3, 4))
    aux: list = []
    logits = ref(tokens, aux)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), tokens.reshape(-1))
    assert ref.loss(tokens, tokens).item() == pytest.approx(ce.item() + aux[0].item(), rel=1e-6)
    assert 0.5 <= aux[0].item() <= 0.5 * 3  # 0.5 x (1 when balanced .. E when one expert takes all)


# ---- expert parallelism on gloo --------------------------------------------------------------
@pytest.mark.timeout(180)
def test_ep2_top2_exact_against_one_process():
    # two replicas of one rank each: experts 0-1 on rank 0, 2-3 on rank 1; every token's rows
    # go to both owners and back (all-to-all), expert gradients sum over nobody else
    spec = make_spec(MOE, [[1, 1, 1, 1]], [([1], 2), ([1], 2)], 2, 8, dtype="float64", ep=2)
    check(launch(spec, timeout_s=150))


@pytest.mark.timeout(180)
def test_tp2_inside_replicas_with_ep2_and_a_dense_layer():
    # TP2 cuts every expert's width 6/6 (and the shared expert's 4/4); the router is replicated
    # and its gradient reaches both TP ranks whole; layer 0 stays dense
    cfg = TinyConfig(layers=2, experts=4, top_k=2, expert_ffn=12, moe_layers=(1,), shared_ffn=8)
    spec = make_spec(cfg, [[2, 2, 2, 2]], [([2], 2), ([2], 2)], 2, 8, dtype="float64", ep=2)
    check(launch(spec, timeout_s=150))


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(180)
def test_ep2_over_the_cp_slices_of_one_replica():
    # Megatron's ep inside cp x dp: the two cp slices of one replica are the EP group, and the
    # balance loss of each sequence adds up from its two chunks (expert counts summed over cp)
    spec = make_spec(MOE, [[1, 1, 1, 1]], [([1], 2)], 1, 8, cp=2, dtype="float64", ep=2)
    check(launch(spec, timeout_s=150))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ep2_with_sequence_parallel_copies_pipeline_recompute_and_ntp_without_ep():
    sp = make_spec(MOE, [[2, 2, 2, 2]], [([2], 2), ([2], 2)], 1, 8, dtype="float64", ep=2, sequence_parallel=True)
    check(launch(sp, timeout_s=250))
    copies = make_spec(MOE, [[2, 1, 2, 2]], [([2], 2), ([2], 2)], 2, 8, dtype="float64", ep=2)
    check(launch(copies, timeout_s=250))
    pp = make_spec(MOE, [[1, 1], [1, 1]], [([1, 1], 3), ([1, 1], 3)], 1, 8, dtype="float64", ep=2, recompute="full")
    check(launch(pp, timeout_s=250))
    # NTP beside MoE (ep 1): TP2 beside TP1, experts resharded 6/6 -> 12 columns for the 1:1 sum
    ntp = make_spec(MOE, [[2, 2, 2, 2]], [([2], 2), ([1], 2)], 2, 8, dtype="float64")
    check(launch(ntp, timeout_s=250))


@pytest.mark.timeout(180)
def test_a_wrong_combine_weight_is_caught(monkeypatch):
    spec = make_spec(MOE, [[1, 1, 1, 1]], [([1], 2), ([1], 2)], 2, 8, dtype="float64", ep=2, steps=1)
    result = launch(spec, timeout_s=150, worker_init=plant(monkeypatch, "moe-combine-wrong-weight"))  # top-2 swapped
    assert result.max_rel_error_loss > 1e-4 and result.max_rel_error_grads > 1e-2


def test_ep_beside_ntp_replicas_is_refused():
    with pytest.raises(ValueError, match="expert parallelism beside replicas of different TP widths"):
        make_spec(MOE, [[2, 2, 2, 2]], [([2], 2), ([1], 2)], 2, 8, ep=2)
    with pytest.raises(ValueError, match=r"experts\(4\) % ep = 0"):
        make_spec(MOE, [[1, 1, 1, 1]], [([1], 1)] * 3, 1, 8, ep=3)


# ---- shrinking MoE plans ---------------------------------------------------------------------
def _plan(model: str, gpus: int, **layout):
    lay = ParallelLayout(global_batch=64, **layout)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus)
    return plan_from_layout(MODELS[model], TrainingSpec(seq_len=4096, global_batch=64), cluster, lay)


def test_shrink_of_a_mixtral_plan_keeps_experts_top2_and_ep():
    plan = _plan("mixtral-8x7b", 32, tp=2, dp=16, ep=4)
    spec = shrink(plan, nproc=8).spec
    cfg = spec.cfg
    assert (cfg.experts, cfg.top_k, cfg.moe_layers, spec.ep, len(spec.replicas)) == (8, 2, (0, 1), 4, 4)
    assert cfg.expert_ffn % 2 == 14336 % 2 and cfg.expert_ffn >= 16
    notes = " ".join(spec.notes)
    assert "experts 8 -> 8 (top-2 kept, dropless)" in notes and "ep 4 kept" in notes
    assert "dense SwiGLU" not in notes and "not executed: ep" not in notes
    # fewer processes: ep 4 needs 4 replicas; 2 of them keep ep 2 and say why
    small = shrink(plan, nproc=4).spec
    assert small.ep == 2 and "ep 4 (run at ep 2: an ep of k needs k pipelines" in " ".join(small.notes)
    # the cost model sees the same experts (validate --profile costs the run as it runs)
    model = run_model(spec, plan.model.name)
    assert (model.num_experts, model.moe_top_k, model.num_moe_layers) == (8, 2, 2)


def test_the_replicas_note_says_they_are_kept_for_ep_and_counts_cp_pipelines():
    plan = _plan("mixtral-8x7b", 32, tp=2, dp=16, ep=4)
    (note,) = [n for n in shrink(plan, nproc=8).spec.notes if n.startswith("replicas")]
    # four replicas run for ep 4; the note used to say "two run the data-parallel sync"
    assert note.endswith(
        ": 4 hold an expert-parallel group of ep 4 (and run the data-parallel sync), more add nothing new"
    )
    (note,) = [n for n in shrink(plan, nproc=6).spec.notes if n.startswith("replicas")]
    assert note.endswith(": 4 (an expert-parallel group) need more than 6 processes; the 2 kept run ep 2")
    # under cp 2, two replicas (four pipelines) hold an ep of 4: the shrink no longer asks for four
    cp = shrink(_plan("mixtral-8x7b", 32, tp=2, dp=8, cp=2, ep=4), nproc=8).spec
    assert (len(cp.replicas), cp.cp, cp.ep) == (4, 2, 4)
    assert any(n.endswith(": two run the data-parallel sync, more add nothing new") for n in cp.notes)


def test_shrink_of_deepseek_moe_keeps_its_dense_first_layer_and_shared_expert():
    spec = shrink(_plan("deepseek-moe-16b", 16, tp=2, dp=8, ep=2), nproc=4).spec
    cfg = spec.cfg
    assert cfg.moe_layers == (1,) and cfg.layers == 2  # a dense layer, then the MoE run
    assert (cfg.experts, cfg.top_k, spec.ep) == (16, 6, 2) and cfg.shared_ffn % 2 == 2816 % 2
    model = run_model(spec, "deepseek")
    assert (model.moe_first_dense_layers, model.num_moe_layers) == (1, 1)


@pytest.mark.timeout(240)
def test_ntp_validate_passes_on_a_mixtral_plan_with_ep(tmp_path):
    from typer.testing import CliRunner

    from ntp_planner.cli import app

    _plan("mixtral-8x7b", 16, tp=1, dp=16, ep=2).save(tmp_path / "mixtral.json")
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "mixtral.json"), "--nproc", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] and out["processes"] == 2
    assert max(out["max_rel_error_loss"], out["max_rel_error_params"], out["max_rel_error_grads"]) <= 1e-5
    assert any("ep 2 kept" in n for n in out["notes"])


def test_shrink_keeps_two_experts_per_ep_rank():
    # Mixtral's 8 experts at ep 8 would leave one per EP rank: its tokens never need sorting among
    # the rank's experts, so that permutation went unexercised; the run holds 16, two per rank
    plan = _plan("mixtral-8x7b", 64, tp=1, dp=64, ep=8)
    spec = shrink(plan, nproc=16).spec
    assert (spec.ep, spec.cfg.experts, spec.cfg.top_k) == (8, 16, 2)
    assert "experts 8 -> 16 (top-2 kept, dropless, two per EP rank" in " ".join(spec.notes)
    # where the plan's experts already give two or more per rank, they are kept (8 at ep 4)
    assert shrink(_plan("mixtral-8x7b", 32, tp=2, dp=16, ep=4), nproc=8).spec.cfg.experts == 8


def test_shrink_of_an_ntp_replan_runs_its_experts_without_ep_and_says_why():
    from ntp_planner.failures.replan import Replanner

    plan = _plan("mixtral-8x7b", 16, tp=8, dp=2, ep=2)
    spec = shrink(plan, nproc=16, replan=Replanner(plan).replan(frozenset({1}), "ntp")).spec
    assert [r.stages[0].width for r in spec.replicas] == [8, 7] and spec.ep == 1 and spec.cfg.experts == 8
    assert "ep 2 (run at ep 1: replicas of different TP widths (NTP)" in " ".join(spec.notes)
