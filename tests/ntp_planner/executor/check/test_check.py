"""The check has no blind spots: every holder of every tensor is compared (float64, so a clean
run errs near 1e-15 and anything above 1e-9 is a bug), the batch has every vocabulary id, and
the shard cuts are those the planner deals. Each planted bug (``tests/support/mutations``) must be caught."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from cost_models.catalogue import resolve_model  # noqa: E402
from ntp_planner.executor.check.cuts import compare_cuts, mismatches  # noqa: E402
from ntp_planner.executor.check.holders import compare  # noqa: E402
from ntp_planner.executor.model.batch import boundary_ids, covers_vocabulary, missing_ids, synthetic_batch  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.launch import launch  # noqa: E402
from tests.support.mutations import plant  # noqa: E402

TOL = 1e-9


def rich_spec(**run):
    """Replica 0 (ranks 0-2): embedding, layer 1 and LM head at degree 3 (8 heads 3/3/2, both KV
    heads cut: KV 0 on ranks 0 and 1, KV 1 on ranks 1 and 2; norms on three TP ranks), layer 0 at
    degree 1 on three copies (rank 1 is copy 1). Replica 1 (ranks 3-4) runs everything at degree
    2, so every block syncs across degrees (NTP). 2 x 3 sequences of 12 tokens deal 6 x 11 = 66
    >= 64 ids."""
    return make_spec(TinyConfig(), [[3, 1, 3, 3]], [([3], 1), ([2], 1)], 3, 12, width=3, dtype="float64", **run)


@pytest.fixture(scope="module")
def clean():
    return launch(rich_spec(), timeout_s=120)


@pytest.mark.timeout(240)
def test_a_clean_run_compares_every_holder_and_is_exact(clean):
    # 5 ranks x (embedding + 2 layers x 9 + norm and LM head) = 5 x 21 holdings
    assert clean.holdings_compared == 105
    assert len(clean.per_replica_error) == 2
    assert max(clean.max_rel_error_loss, clean.max_rel_error_grads, clean.max_rel_error_params) < TOL
    assert clean.vocab_ids_missing == 0
    assert clean.losses[2] < clean.losses[0]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_doubled_gradient_on_copy_1_is_caught_and_named(monkeypatch, clean):
    result = launch(rich_spec(), timeout_s=120, worker_init=plant(monkeypatch, "doubled-grad-copy1"))
    # copy 1 of layer 0 holds the whole tensor: its error is |2g - g| / |g| = 1; copy 0 is right
    assert result.max_rel_error_grads == pytest.approx(1.0, rel=1e-9)
    assert result.worst_grad.startswith("layers.0.")
    assert result.worst_grad_holder == "rank 1 (replica 0, stage 0, copy 1, TP rank 0)"
    assert result.max_rel_error_grads > 1e8 * clean.max_rel_error_grads


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_embedding_mask_off_by_one_is_caught(monkeypatch, clean):
    result = launch(rich_spec(), timeout_s=120, worker_init=plant(monkeypatch, "embed-mask-off-by-one"))
    # ids 22 and 43 (replica 0) and 32 (replica 1) also get the row before them
    assert result.max_rel_error_loss > 1e-6 and result.max_rel_error_grads > 1e-3
    assert result.max_rel_error_params > 1e4 * clean.max_rel_error_params


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_nan_on_copy_1_fails_the_run_and_names_its_holder(monkeypatch):
    result = launch(rich_spec(), timeout_s=120, worker_init=plant(monkeypatch, "nan-grad-copy1"))
    # NaN compares false with everything: the scan used to skip it and report the clean holders' 1e-15
    assert result.max_rel_error_grads == float("inf") and result.max_rel_error_params == float("inf")
    assert result.worst_grad_holder == "rank 1 (replica 0, stage 0, copy 1, TP rank 0)"
    assert any("not finite on rank 1 (replica 0, stage 0, copy 1, TP rank 0)" in p for p in result.problems)


def holding(name, values, rank=0, grad=None):
    return {"name": name, "rank": rank, "replica": rank, "stage": 0, "copy": 0, "tp_rank": 0, "index": [],
            "param": torch.tensor(values, dtype=torch.float64), "grad": grad}  # fmt: skip


def test_compare_fails_on_a_nan_or_inf_anywhere_and_names_the_first_holder():
    ref = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "b": torch.tensor([3.0], dtype=torch.float64)}
    grads = {k: torch.ones_like(v) for k, v in ref.items()}
    clean = [holding("w", [1.0, 2.0], 0), holding("b", [3.0], 0), holding("w", [1.0, 2.0], 1)]
    assert compare(clean, ref, grads)["problems"] == [] and compare(clean, ref, grads)["max_rel_error_params"] == 0
    # a NaN on rank 1 among exact holdings: the old scan (err >= worst) skipped it and passed at 0
    bad = [*clean[:2], holding("w", [float("nan"), 2.0], 1)]
    got = compare(bad, ref, grads)
    assert got["max_rel_error_params"] == float("inf") and got["worst_param_holder"].startswith("rank 1 ")
    assert got["problems"] == ["w's value is not finite on rank 1 (replica 1, stage 0, copy 0, TP rank 0)"]
    # every holding NaN used to crash the comparison (no worst holder); inf in a gradient, and in the reference
    every = [holding("w", [float("nan")] * 2, 0), holding("b", [float("nan")], 0, grad=torch.tensor([float("inf")]))]
    got = compare(every, ref, grads)
    assert got["worst_param"] == "w" and len(got["problems"]) == 3
    assert "b's gradient is not finite on rank 0" in got["problems"][2]
    got = compare(clean[:1], {"w": torch.tensor([1.0, float("nan")], dtype=torch.float64)}, grads)
    assert got["problems"] == ["w's value is not finite on the reference (the part rank 0 (replica 0, stage 0, "
                               "copy 0, TP rank 0) holds)"]  # fmt: skip


def test_the_batch_has_every_vocabulary_id_and_the_boundaries_first():
    spec = rich_spec()
    # vocabulary 64 cut 22/21/21 (degree 3) and 32/32 (degree 2)
    assert boundary_ids(spec) == [0, 21, 22, 31, 32, 42, 43, 63]
    assert covers_vocabulary(spec) and missing_ids(spec) == ([], [])
    tokens, targets = synthetic_batch(spec)
    assert tokens.shape == targets.shape == (6, 12) and torch.equal(tokens[:, 1:], targets[:, :-1])
    # one sequence of 8 tokens deals 7 positions: too few for 64 ids, enough for the 4 boundary ids
    small = make_spec(TinyConfig(), [[2, 2, 2, 2]], [([2], 1)], 1, 8)
    assert not covers_vocabulary(small)
    tokens, targets = synthetic_batch(small)
    assert {0, 31, 32, 63} <= set(tokens.flatten().tolist()) & set(targets.flatten().tolist())


def cuts_spec():
    """Degrees 1, 2 and 3 with Llama-3-8B's FFN and vocabulary modulo 6 (what ``shrink`` keeps)."""
    return make_spec(TinyConfig(vocab=66, ffn=50), [[3, 1, 3, 3]], [([3], 1), ([2], 1)], 3, 12, width=3)


def test_the_cuts_match_the_planners_shares_of_the_real_model():
    rows = compare_cuts(cuts_spec(), resolve_model("llama3-8b"))  # 32 heads, 8 KV heads, FFN 14336, vocab 128256
    by = {(r["unit"], r["degree"]): r for r in rows}
    assert sorted(by) == sorted(
        [(u, t) for u in ("heads", "kv_heads", "ffn") for t in (1, 2, 3)] + [("vocab", 2), ("vocab", 3)]
    )
    assert all(r["match"] for r in rows) and mismatches(rows) == ""
    # the run deals 8 heads, the planner 32: the first two ranks are fuller by one in both
    assert by["heads", 3]["executor"] == [3, 3, 2] and by["heads", 3]["planner"] == [11, 11, 10]
    # 50 = 3 x 16 + 2 and 14336 = 3 x 4778 + 2 columns; 8 heads in 2 KV groups give KV 1/2/1, 32 in 8 give 3/4/3
    assert by["ffn", 3]["executor"] == [17, 17, 16] and by["ffn", 3]["planner"] == [4779, 4779, 4778]
    assert by["kv_heads", 3]["executor"] == [1, 2, 1] and by["kv_heads", 3]["planner"] == [3, 4, 3]


def test_an_ffn_width_with_another_remainder_is_a_mismatch():
    # 48 columns split evenly at degree 3, the planner's 14336 do not
    rows = compare_cuts(make_spec(TinyConfig(vocab=66), [[3, 3, 3, 3]], [([3], 1)], 1, 8), resolve_model("llama3-8b"))
    assert [(r["unit"], r["degree"]) for r in rows if not r["match"]] == [("ffn", 3)]


def test_cuts_that_match_the_planners_in_number_but_not_in_order_fail(monkeypatch):
    plant(monkeypatch, "cuts-reversed")  # in this process: the check runs here
    rows = compare_cuts(cuts_spec(), resolve_model("llama3-8b"))
    bad = {(r["unit"], r["degree"]) for r in rows if not r["match"]}
    assert bad == {("heads", 3), ("ffn", 3)}  # KV heads 1/2/1 read the same both ways; vocab 66 is even at 2 and 3
    assert "heads at degree 3: executor 2/3/3, planner 11/11/10" in mismatches(rows)
