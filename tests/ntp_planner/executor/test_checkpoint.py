"""Rank checkpoints: saved from TP4 x DP2, loaded into other layouts equal to the reference rows;
complete only with a manifest; the last two kept; damaged files named in one sentence."""

import json

import pytest
import torch

from ntp_planner.executor import checkpoint as ckpt
from ntp_planner.executor.elastic.state import held
from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.spec import RunSpec, TinyConfig, make_spec

CFG = TinyConfig()  # 8 heads, 2 KV heads (head_dim 4), FFN 48, vocabulary 64, 2 layers
FULL = {n: p.detach() for n, p in Reference(CFG).named_parameters()}


def tp(*widths: int, pp: int = 1, cfg: TinyConfig = CFG) -> RunSpec:
    return make_spec(cfg, [[4] * (4 // pp)] * pp, [([w] * pp, 1) for w in widths], 1, 4, width=4)


def _slice(full: torch.Tensor, index) -> torch.Tensor:
    return full if index is None else full.index_select(index[0], torch.tensor(index[1]))


def _full_state(name: str) -> dict[str, torch.Tensor]:
    p = FULL[name]
    return {"param": p, "exp_avg": p * 2 + 1, "exp_avg_sq": p.square(), "step": torch.tensor(7.0)}


def rank_state(spec: RunSpec, rank: int) -> dict:
    """What ``state.snapshot`` gives on ``rank``: its rows of the reference's state."""
    out = {}
    for name, index in held(spec, rank).items():
        full = _full_state(name)
        out[name] = {k: v if k == "step" else _slice(v, index).clone() for k, v in full.items()}
    return out


def save_all(root, step: int, spec: RunSpec = None, finish: bool = True) -> None:
    spec = spec or tp(4, 4)
    for rank in range(spec.world_size):
        ckpt.save(root, step, 100 * step, spec, rank, rank_state(spec, rank))
    if finish:
        ckpt.finish(root, step, spec.world_size, {"policy": "ntp"})


@pytest.mark.parametrize("spec", [tp(3, 4), tp(2, 1, pp=2), tp(4, 4), tp(1)], ids=["tp3+tp4", "pp2", "same", "tp1"])
def test_saved_from_tp4_dp2_loads_into_any_layout(tmp_path, spec):
    save_all(tmp_path, 10)
    for rank in range(spec.world_size):
        got = ckpt.load(tmp_path, 10, spec, rank)
        want = rank_state(spec, rank)
        assert list(got) == list(want)
        for name in want:
            for k in ("param", "exp_avg", "exp_avg_sq"):
                assert torch.equal(got[name][k], want[name][k]), (rank, name, k)
            assert float(got[name]["step"]) == 7.0
    info = ckpt.info(tmp_path, 10)
    assert (info["consumed_samples"], info["world"], info["meta"]) == (1000, 8, {"policy": "ntp"})


def test_every_row_is_written_once(tmp_path):
    save_all(tmp_path, 10)
    count: dict[str, int] = {}
    for rank in range(8):
        tensors = torch.load(ckpt.rank_file(tmp_path, 10, rank), weights_only=True)["tensors"]
        for name, t in tensors.items():
            count[name] = count.get(name, 0) + (1 if t["rows"] is None else len(t["rows"]))
    for name, full in FULL.items():
        index = held(tp(4), 0)[name]
        assert count[name] == (1 if index is None else full.shape[index[0]]), name
    # replica 1 (ranks 4..7) holds only rows replica 0 already wrote: its files are empty
    assert all(not torch.load(ckpt.rank_file(tmp_path, 10, r), weights_only=True)["tensors"] for r in range(4, 8))
    # TP4 ranks hold KV heads 0, 0, 1, 1: rank 1 writes no K rows, rank 2 writes KV head 1 (rows 4..7)
    files = ckpt.info(tmp_path, 10)["files"]
    assert "layers.0.k" not in files["rank-00001.pt"] and files["rank-00002.pt"]["layers.0.k"] == [[4, 8]]


def test_a_checkpoint_without_its_manifest_does_not_count(tmp_path):
    assert ckpt.latest(tmp_path / "none") is None
    save_all(tmp_path, 10)
    save_all(tmp_path, 20, finish=False)  # a crash before rank 0 wrote the manifest
    assert ckpt.latest(tmp_path) == 10
    with pytest.raises(ValueError, match=r"checkpoint step 20 in .* is not complete \(no manifest.json\)"):
        ckpt.load(tmp_path, 20, tp(4), 0)


def test_finish_needs_every_rank_file(tmp_path):
    ckpt.save(tmp_path, 10, 0, tp(4, 4), 0, rank_state(tp(4, 4), 0))
    with pytest.raises(ValueError, match=r"lacks \['rank-00001.pt'"):
        ckpt.finish(tmp_path, 10, 8)
    assert ckpt.latest(tmp_path) is None


def test_the_last_two_complete_checkpoints_are_kept(tmp_path):
    save_all(tmp_path, 10)
    save_all(tmp_path, 15, finish=False)  # abandoned
    save_all(tmp_path, 20)
    assert sorted(d.name for d in tmp_path.iterdir()) == ["step-00000010", "step-00000015", "step-00000020"]
    save_all(tmp_path, 40, finish=False)  # in progress
    save_all(tmp_path, 30)
    assert sorted(d.name for d in tmp_path.iterdir()) == ["step-00000020", "step-00000030", "step-00000040"]
    assert ckpt.complete_steps(tmp_path) == [20, 30] and ckpt.latest(tmp_path) == 30


def test_no_temporary_files_are_left(tmp_path):
    save_all(tmp_path, 10)
    assert sorted(f.name for f in ckpt.step_dir(tmp_path, 10).iterdir()) == [
        "manifest.json",
        *(f"rank-{r:05d}.pt" for r in range(8)),
    ]


def test_a_corrupt_file_is_named_in_one_sentence(tmp_path):
    save_all(tmp_path, 10)
    ckpt.rank_file(tmp_path, 10, 2).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"rank-00002.pt is not a readable rank checkpoint file \(\w+\)$"):
        ckpt.load(tmp_path, 10, tp(4), 2)


def test_an_alien_file_is_named_in_one_sentence(tmp_path):
    save_all(tmp_path, 10)
    torch.save({"weights": torch.zeros(2)}, ckpt.rank_file(tmp_path, 10, 0))
    with pytest.raises(ValueError, match=r"rank-00000.pt is not an ntp rank checkpoint file"):
        ckpt.load(tmp_path, 10, tp(4), 0)


def test_rows_no_file_holds_are_named(tmp_path):
    save_all(tmp_path, 10)
    path = ckpt.step_dir(tmp_path, 10) / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["files"]["rank-00003.pt"]  # as if rank 3's rows were never written
    path.write_text(json.dumps(manifest))
    ckpt.load(tmp_path, 10, tp(4), 0)  # rank 0 needs nothing of rank 3's
    with pytest.raises(ValueError, match=r"has no copy of rows \[48, 49, 50, 51, 52, 53, 54, 55\] ... of embed"):
        ckpt.load(tmp_path, 10, tp(4), 3)


def test_another_model_is_refused(tmp_path):
    save_all(tmp_path, 10)
    other = tp(4, cfg=TinyConfig(ffn=40))
    with pytest.raises(ValueError, match=r"checkpoint step 10 holds the model TinyConfig\(.*ffn=48"):
        ckpt.load(tmp_path, 10, other, 0)


def test_an_unwritable_directory_is_one_sentence(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"^cannot write checkpoint file .*a-file/ckpt/step-00000010/rank-00000.pt: "):
        ckpt.save(blocker / "ckpt", 10, 0, tp(4), 0, rank_state(tp(4), 0))
