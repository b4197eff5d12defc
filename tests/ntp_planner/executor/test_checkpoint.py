"""DCP checkpoints: saved from TP4 x DP2 and from uneven NTP (TP3 beside TP4), loaded into other
layouts equal to the reference rows in float64; read whole by plain DCP tools; every row written
once; complete only with a manifest; the last two kept; damaged files named in one sentence."""

import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ntp_planner.executor import checkpoint as ckpt
from ntp_planner.executor.checkpoint import files
from ntp_planner.executor.checkpoint.planners import Chunk, RowsSavePlanner, runs
from ntp_planner.executor.elastic.state import held
from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.spec import RunSpec, TinyConfig, make_spec

CFG = TinyConfig()  # 8 heads, 2 KV heads (head_dim 4, K and V 8 x 32), FFN 48, vocabulary 64, 2 layers
FULL = {n: p.detach().double() for n, p in Reference(CFG).named_parameters()}
KEYS = ("param", "exp_avg", "exp_avg_sq")


def tp(*widths: int, pp: int = 1, cfg: TinyConfig = CFG) -> RunSpec:
    return make_spec(cfg, [[4] * (4 // pp)] * pp, [([w] * pp, 1) for w in widths], 1, 4, width=4)


def _slice(full: torch.Tensor, index) -> torch.Tensor:
    return full if index is None else full.index_select(index[0], torch.tensor(index[1]))


def _full_state(name: str, cfg: TinyConfig = CFG) -> dict[str, torch.Tensor]:
    """A state whose three tensors differ everywhere, so a row read from the wrong key or place shows."""
    p = FULL[name] if cfg == CFG else dict(Reference(cfg).named_parameters())[name].detach().double()
    return {"param": p, "exp_avg": p * 2 + 1, "exp_avg_sq": p.square() + 3, "step": torch.tensor(7.0)}


def rank_state(spec: RunSpec, rank: int) -> dict:
    """What ``state.snapshot`` gives on ``rank``: its rows of the reference's state."""
    out = {}
    for name, index in held(spec, rank).items():
        full = _full_state(name, spec.cfg)
        out[name] = {k: v if k == "step" else _slice(v, index).clone() for k, v in full.items()}
    return out


def save_all(root, step: int, spec: RunSpec = None, finish: bool = True) -> None:
    spec = spec or tp(4, 4)
    for rank in range(spec.world_size):
        ckpt.save(root, step, 100 * step, spec, rank, rank_state(spec, rank))
    if finish:
        ckpt.finish(root, step, spec.world_size, {"policy": "ntp"})


def _metadata(root, step: int):
    return pickle.loads((ckpt.step_dir(root, step) / ".metadata").read_bytes())


SOURCES = {"tp4x2": tp(4, 4), "tp3+tp4": tp(3, 4), "tp3-pp2": tp(3, pp=2)}
TARGETS = {"tp3+tp4": tp(3, 4), "pp2": tp(2, 1, pp=2), "tp4x2": tp(4, 4), "tp1": tp(1), "tp3": tp(3)}


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES)
def test_saved_in_one_layout_loads_into_any_other_exactly(tmp_path, source):
    save_all(tmp_path, 10, source)
    for spec in TARGETS.values():
        for rank in range(spec.world_size):
            got = ckpt.load(tmp_path, 10, spec, rank)
            want = rank_state(spec, rank)
            assert list(got) == list(want)
            for name in want:
                for k in KEYS:
                    assert got[name][k].dtype == torch.float64 and torch.equal(got[name][k], want[name][k]), (
                        spec.label,
                        rank,
                        name,
                        k,
                    )
                assert float(got[name]["step"]) == 7.0
    info = ckpt.info(tmp_path, 10)
    assert (info["consumed_samples"], info["world"], info["meta"]) == (1000, source.world_size, {"policy": "ntp"})


def test_plain_dcp_reads_full_tensors_without_a_process_group(tmp_path):
    save_all(tmp_path, 10, tp(3, 4))
    sd = {k: {n: torch.zeros_like(p) for n, p in FULL.items()} for k in KEYS}
    sd |= {"step": {n: torch.tensor(0.0) for n in FULL}, "train": {"step": 0, "consumed_samples": 0}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        dcp.load(sd, checkpoint_id=ckpt.step_dir(tmp_path, 10))
    dcp_to_torch_save(ckpt.step_dir(tmp_path, 10), tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    assert sd["train"] == {"step": 10, "consumed_samples": 1000} and whole["train"]["consumed_samples"] == 1000
    for name in FULL:
        for k in KEYS:
            want = _full_state(name)[k]
            assert torch.equal(sd[k][name], want) and torch.equal(whole[k][name], want), (name, k)
        assert float(sd["step"][name]) == float(whole["step"][name]) == 7.0


def test_every_row_is_written_once(tmp_path):
    save_all(tmp_path, 10)
    md = _metadata(tmp_path, 10)
    for name, full in FULL.items():
        index = held(tp(4), 0)[name]
        for k in KEYS:
            chunks = md.state_dict_metadata[f"{k}.{name}"].chunks
            if index is None:
                assert [list(c.sizes) for c in chunks] == [list(full.shape)], name
                continue
            rows = sorted(
                r for c in chunks for r in range(c.offsets[index[0]], c.offsets[index[0]] + c.sizes[index[0]])
            )
            assert rows == list(range(full.shape[index[0]])), (name, k)
    # replica 1 (ranks 4..7) holds only rows replica 0 already wrote: its folders hold no tensor
    for rank in range(4, 8):
        rank_md = pickle.loads((ckpt.rank_dir(tmp_path, 10, rank) / ".metadata").read_bytes())
        assert rank_md.state_dict_metadata == {}, rank
    # TP4 ranks hold KV heads 0, 0, 1, 1 of K (8 x 32): rank 0 writes rows 0..3, rank 2 rows 4..7
    paths = {
        tuple(c.offsets): md.storage_data[idx].relative_path
        for idx in md.storage_data
        if idx.fqn == "param.layers.0.k"
        for c in [md.state_dict_metadata["param.layers.0.k"].chunks[idx.index]]
    }
    assert paths == {(0, 0): "rank-00000/__0_0.distcp", (4, 0): "rank-00002/__0_0.distcp"}


def test_the_cut_kv_head_of_uneven_ntp_is_written_by_its_first_holder(tmp_path):
    # TP3 x 8 heads: ranks hold heads 0..2, 3..5, 6..7 (q rows 0..11, 12..23, 24..31); KV heads
    # 0, 0..1, 1 (k rows 0..3, 0..7, 4..7): rank 1 writes only rows 4..7, rank 2 nothing of k
    save_all(tmp_path, 10, tp(3))
    md = _metadata(tmp_path, 10)
    boxes = lambda fqn: sorted((c.offsets[0], c.sizes[0]) for c in md.state_dict_metadata[fqn].chunks)  # noqa: E731
    assert boxes("param.layers.0.k") == [(0, 4), (4, 4)]
    assert boxes("param.layers.0.q") == [(0, 12), (12, 12), (24, 8)]
    owners = {md.storage_data[i].relative_path.split("/")[0] for i in md.storage_data if i.fqn == "exp_avg.layers.1.v"}
    assert owners == {"rank-00000", "rank-00001"}


def test_rows_held_out_of_order_are_written_and_read_as_runs(tmp_path, monkeypatch):
    # no layout of ours holds rows out of order, but the formats allow it: rank 0 holding K rows
    # 6, 7, 0..5 writes two boxes (rows 6..7 from positions 0..1, rows 0..5 from 2..7), and a
    # reader wanting rows 5, 6, 1, 2 reads them across both boxes, in that order
    order = (6, 7, 0, 1, 2, 3, 4, 5)
    monkeypatch.setattr(files, "held", lambda spec, rank: {"layers.0.k": (0, order)})
    full = _full_state("layers.0.k")
    state = {"layers.0.k": {k: v if k == "step" else _slice(v, (0, order)) for k, v in full.items()}}
    ckpt.save(tmp_path, 10, 0, tp(1), 0, state)
    ckpt.finish(tmp_path, 10, 1)
    boxes = sorted(
        (c.offsets[0], c.sizes[0]) for c in _metadata(tmp_path, 10).state_dict_metadata["param.layers.0.k"].chunks
    )
    assert boxes == [(0, 6), (6, 2)]
    wants = {f"{k}.layers.0.k": (0, (5, 6, 1, 2)) for k in KEYS} | {"param.layers.0.q": (0, (3,))}
    with pytest.raises(ValueError, match=r"^here has no copy of rows \[3\] of layers.0.q$"):
        ckpt.read_rows(ckpt.step_dir(tmp_path, 10), wants, "here")
    del wants["param.layers.0.q"]
    got = ckpt.read_rows(ckpt.step_dir(tmp_path, 10), wants, "here")
    for k in KEYS:
        assert torch.equal(got[f"{k}.layers.0.k"], _slice(full[k], (0, (5, 6, 1, 2)))), k


def test_a_checkpoint_without_its_manifest_does_not_count(tmp_path):
    assert ckpt.latest(tmp_path / "none") is None
    save_all(tmp_path, 10)
    save_all(tmp_path, 20, finish=False)  # a crash before rank 0 wrote the manifest
    assert ckpt.latest(tmp_path) == 10
    with pytest.raises(ValueError, match=r"checkpoint step 20 in .* is not complete \(no manifest.json\)"):
        ckpt.load(tmp_path, 20, tp(4), 0)
    ckpt.save(tmp_path, 10, 0, tp(4, 4), 0, rank_state(tp(4, 4), 0))  # step 10 saved again (a restart)
    assert ckpt.latest(tmp_path) is None and not (ckpt.step_dir(tmp_path, 10) / ".metadata").exists()


def test_finish_needs_every_rank(tmp_path):
    ckpt.save(tmp_path, 10, 0, tp(4, 4), 0, rank_state(tp(4, 4), 0))
    with pytest.raises(ValueError, match=r"lacks \['rank-00001', 'rank-00002'"):
        ckpt.finish(tmp_path, 10, 8)
    assert ckpt.latest(tmp_path) is None


def test_finish_refuses_rows_written_twice(tmp_path):
    save_all(tmp_path, 10, finish=False)  # TP4 x DP2
    for rank in range(3):  # ranks 0..2 saved again from a TP3 layout: TP4 rank 3's rows 36..47 of up twice
        ckpt.save(tmp_path, 10, 0, tp(3), rank, rank_state(tp(3), rank))
    with pytest.raises(
        ValueError,
        match=r"step 10 in .* is inconsistent: the chunks of param\.\S+ at \[\d+, 0\] and \[\d+, 0\] overlap$",
    ):
        ckpt.finish(tmp_path, 10, 8)
    assert ckpt.latest(tmp_path) is None


def test_finish_refuses_ranks_of_another_model(tmp_path):
    save_all(tmp_path, 10, tp(2), finish=False)
    other = tp(2, cfg=TinyConfig(ffn=40))  # rank 1 saved again from a model with a smaller FFN
    ckpt.save(tmp_path, 10, 0, other, 1, rank_state(other, 1))
    with pytest.raises(
        ValueError,
        match=r"is inconsistent: rank 1 saved param\.layers\.0\.(gate|up) as \[40, 32\] torch.float64, an earlier "
        r"rank as \[48, 32\] torch.float64$",
    ):
        ckpt.finish(tmp_path, 10, 2)


def test_a_smaller_layout_saving_a_step_again_drops_the_larger_ones_folders(tmp_path):
    save_all(tmp_path, 10)  # world 8
    save_all(tmp_path, 10, tp(3))  # world 3: rank-00003..7 are stale
    assert sorted(d.name for d in ckpt.step_dir(tmp_path, 10).glob("rank-*")) == [f"rank-{r:05d}" for r in range(3)]
    got = ckpt.load(tmp_path, 10, tp(4), 3)
    assert torch.equal(got["layers.1.down"]["exp_avg"], rank_state(tp(4), 3)["layers.1.down"]["exp_avg"])


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
    save_all(tmp_path, 10, tp(2))
    d = ckpt.step_dir(tmp_path, 10)
    assert sorted(str(f.relative_to(d)) for f in d.rglob("*") if f.is_file()) == [
        ".metadata",
        "manifest.json",
        "rank-00000/.metadata",
        "rank-00000/__0_0.distcp",
        "rank-00001/.metadata",
        "rank-00001/__0_0.distcp",
    ]


def _data_file(root, rank: int):
    return ckpt.rank_dir(root, 10, rank) / "__0_0.distcp"


def test_a_truncated_data_file_is_named_in_one_sentence(tmp_path):
    save_all(tmp_path, 10)
    data = _data_file(tmp_path, 2).read_bytes()
    _data_file(tmp_path, 2).write_bytes(data[: len(data) // 2])
    ckpt.load(tmp_path, 10, tp(4), 0)  # rank 0 reads nothing of rank 2's
    why = rf"its data file rank-00002/__0_0.distcp is truncated \({len(data) // 2} of at least \d+ bytes\)$"
    with pytest.raises(ValueError, match=r"^checkpoint step 10 in .*: " + why):
        ckpt.load(tmp_path, 10, tp(4), 2)


def test_a_damaged_data_file_is_named_in_one_sentence(tmp_path):
    save_all(tmp_path, 10)
    data = bytearray(_data_file(tmp_path, 1).read_bytes())
    data[:64] = bytes(64)  # the first tensor's zip header
    _data_file(tmp_path, 1).write_bytes(bytes(data))
    why = r"its data file rank-00001/__0_0.distcp is damaged \(\w+\)$"
    with pytest.raises(ValueError, match=r"^checkpoint step 10 in .*: " + why):
        ckpt.load(tmp_path, 10, tp(4), 1)


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"not a pickle", r"is not readable DCP metadata \(\w+\)$"), (None, r"has no DCP metadata \(.metadata\)$")],
)
def test_damaged_dcp_metadata_is_one_sentence(tmp_path, content, why):
    save_all(tmp_path, 10)
    path = ckpt.step_dir(tmp_path, 10) / ".metadata"
    path.unlink() if content is None else path.write_bytes(content)
    with pytest.raises(ValueError, match=why):
        ckpt.load(tmp_path, 10, tp(4), 0)


def test_an_alien_manifest_is_named_in_one_sentence(tmp_path):
    save_all(tmp_path, 10)
    (ckpt.step_dir(tmp_path, 10) / "manifest.json").write_text('{"format": "ntp-rank-checkpoint/1"}')
    with pytest.raises(ValueError, match=r"manifest.json is not an ntp DCP checkpoint manifest$"):
        ckpt.load(tmp_path, 10, tp(4), 0)


def test_rows_no_chunk_holds_are_named(tmp_path):
    save_all(tmp_path, 10)
    path = ckpt.step_dir(tmp_path, 10) / ".metadata"
    md = pickle.loads(path.read_bytes())
    for fqn, item in md.state_dict_metadata.items():  # as if rank 3's rows were never written
        if hasattr(item, "chunks"):
            keep = [c for i, c in enumerate(item.chunks) if not _in_rank(md, fqn, i, 3)]
            item.chunks[:] = keep
    path.write_bytes(pickle.dumps(md))
    ckpt.load(tmp_path, 10, tp(4), 0)  # rank 0 needs nothing of rank 3's
    with pytest.raises(ValueError, match=r"has no copy of rows \[48, 49, 50, 51, 52, 53, 54, 55\] ... of embed$"):
        ckpt.load(tmp_path, 10, tp(4), 3)


def _in_rank(md, fqn: str, i: int, rank: int) -> bool:
    (idx,) = [x for x in md.storage_data if x.fqn == fqn and x.index == i]
    return md.storage_data[idx].relative_path.startswith(f"rank-{rank:05d}/")


def test_another_model_is_refused(tmp_path):
    save_all(tmp_path, 10)
    other = tp(4, cfg=TinyConfig(ffn=40))
    with pytest.raises(ValueError, match=r"checkpoint step 10 holds the model TinyConfig\(.*ffn=48"):
        ckpt.load(tmp_path, 10, other, 0)


def test_an_unwritable_directory_is_one_sentence(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"^cannot write checkpoint files in .*a-file/ckpt/step-00000010/rank-00000: "):
        ckpt.save(blocker / "ckpt", 10, 0, tp(4), 0, rank_state(tp(4), 0))


def _held_chunks(spec: RunSpec, rank: int) -> list[Chunk]:
    """Every row ``rank`` holds, as chunks (without ``speaks``: a cut KV head twice)."""
    out = []
    for name, index in held(spec, rank).items():
        for k, v in rank_state(spec, rank)[name].items():
            if k == "step" or index is None:
                out.append(Chunk(f"{k}.{name}", tuple(v.shape), None, 0, v.clone()))
                continue
            shape = tuple(FULL[name].shape)
            for at, start, n in runs(index[1]):
                out.append(Chunk(f"{k}.{name}", shape, index[0], start, v.narrow(index[0], at, n).clone()))
    return out


def _collective_worker(rank: int, world: int, store: str, folder: str) -> None:
    """One rank of a gloo group saving with DCP's collective ``dcp.save``: the rows it speaks
    for into ``folder/speaks``, then every row it holds into ``folder/held``."""
    import os
    import traceback
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", store=dist.FileStore(store, world), rank=rank, world_size=world, timeout=timedelta(seconds=30)
        )
        spec = tp(3)
        chunks = ckpt.rank_chunks(spec, rank, rank_state(spec, rank))
        objects = {"train.consumed_samples": 1000} if rank == 0 else {}
        dcp.save({}, storage_writer=dcp.FileSystemWriter(f"{folder}/speaks"), planner=RowsSavePlanner(chunks, objects))
        try:
            twice = RowsSavePlanner(_held_chunks(spec, rank), {})
            dcp.save({}, storage_writer=dcp.FileSystemWriter(f"{folder}/held"), planner=twice)
            refused = ""
        except BaseException as exc:  # DCP raises CheckpointException, a BaseException, on every rank
            refused = f"{type(exc).__name__}: {exc}"
        with open(f"{folder}/{rank}.refused", "w") as f:
            f.write(refused)
        dist.destroy_process_group()
    except BaseException:
        with open(f"{folder}/{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    os._exit(0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_collective_dcp_save_on_gloo_writes_the_same_checkpoint(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    args = [(r, 3, str(tmp_path / "store"), str(tmp_path)) for r in range(3)]
    procs = [ctx.Process(target=_collective_worker, args=a, daemon=True) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    for p in procs:
        if p.is_alive():
            p.kill()
    errors = [f.read_text() for f in sorted(tmp_path.glob("*.err"))]
    assert not errors and all(p.exitcode == 0 for p in procs), errors or [p.exitcode for p in procs]
    # one folder, DCP's own layout: a data file per rank and the coordinator's .metadata
    files = sorted(f.name for f in (tmp_path / "speaks").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    # read back at TP4 rank 2 (KV head 1, q rows 16..23) through the rows planner
    wants = {f"{k}.{n}": i for n, i in held(tp(4), 2).items() for k in KEYS}
    got = ckpt.read_rows(tmp_path / "speaks", wants, "the collective checkpoint")
    want = rank_state(tp(4), 2)
    assert all(torch.equal(got[f"{k}.{n}"], want[n][k]) for n in want for k in KEYS)
    # every row held (the cut KV head on ranks 0 and 1): refused on every rank, nothing written
    refused = [(tmp_path / f"{r}.refused").read_text() for r in range(3)]
    assert all(
        r.startswith("CheckpointException") and "rows would be written twice: the chunks of " in r for r in refused
    ), refused
    assert not (tmp_path / "held" / ".metadata").exists()
