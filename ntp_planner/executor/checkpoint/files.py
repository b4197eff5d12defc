"""Where checkpoints live on disk, and the save / finish / load steps live recovery calls.

Each rank saves on its own (``dcp.save`` with ``no_dist=True``: no collective, so a lost peer
cannot hang a save) into its own folder; once every rank has saved, rank 0 merges their DCP
metadata into the step's ``.metadata`` (each chunk's file path prefixed by its rank's folder),
which makes the step folder one plain DCP checkpoint, then writes ``manifest.json``, which makes
the step complete for us. A loader plans its reads against the merged metadata.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.storage import WriteResult

from ntp_planner.executor.checkpoint.planners import (
    Chunk,
    Rows,
    RowsLoadPlanner,
    RowsSavePlanner,
    missing_rows,
    overlaps,
    runs,
)
from ntp_planner.executor.elastic.state import STATE_KEYS, Index, held, select_rows, shapes
from ntp_planner.executor.spec import RunSpec

FORMAT = "ntp-dcp-checkpoint/1"
MANIFEST = "manifest.json"
METADATA = ".metadata"  # DCP's name for a checkpoint's metadata (FileSystemWriter writes it)
KEEP = 2  # complete checkpoints kept


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def rank_dir(root: str | Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}"


def speaks(spec: RunSpec, rank: int) -> dict[str, tuple[Index, tuple[int, ...] | None]]:
    """Name -> (the rows ``rank`` writes, their positions in its holding) for every parameter
    it is the first holder of some rows of, in rank order. Worked example: at TP3 the KV head 0
    (rows 0..3 of K) lives on ranks 0 and 1, so rank 1 writes only KV head 1:

    >>> from ntp_planner.executor.spec import TinyConfig, make_spec
    >>> speaks(make_spec(TinyConfig(), [[3, 3, 3, 3]], [([3], 1)], 1, 4), 1)["layers.0.k"]
    ((0, (4, 5, 6, 7)), (4, 5, 6, 7))
    """
    before: dict[str, set] = {}
    for r in range(rank):
        for name, index in held(spec, r).items():
            before.setdefault(name, set()).update((None,) if index is None else index[1])
    out = {}
    for name, index in held(spec, rank).items():
        taken = before.get(name, set())
        if index is None:
            if None not in taken:
                out[name] = (None, None)
            continue
        pos = tuple(i for i, row in enumerate(index[1]) if row not in taken)
        if pos:
            out[name] = ((index[0], tuple(index[1][i] for i in pos)), pos)
    return out


def rank_chunks(spec: RunSpec, rank: int, state: dict) -> list[Chunk]:
    """The chunks ``rank`` writes: for every parameter it speaks for, one chunk per run of
    consecutive rows of param, exp_avg and exp_avg_sq, and AdamW's step from the parameter's
    first holder (every holder has the same one)."""
    earlier = {name for r in range(rank) for name in held(spec, r)}
    out = []
    for name, (index, pos) in speaks(spec, rank).items():
        shape = shapes(spec.cfg)[name]
        rows = select_rows(state[name], None if index is None else index[0], pos)
        pieces = [(0, 0, 0)] if index is None else runs(index[1])
        for k in STATE_KEYS:
            data = rows[k].detach().cpu()
            for at, start, n in pieces:
                part = data if index is None else data.narrow(index[0], at, n)
                out.append(Chunk(f"{k}.{name}", shape, None if index is None else index[0], start, part.clone()))
        if name not in earlier:
            out.append(Chunk(f"step.{name}", (), None, 0, torch.as_tensor(rows["step"]).detach().cpu().clone()))
    return out


def save(root: str | Path, step: int, consumed_samples: int, spec: RunSpec, rank: int, state: dict) -> Path:
    """Write this rank's part of checkpoint ``step`` (``state``: its ``state.snapshot``) as a DCP
    checkpoint of its chunks in ``rank_dir``; rank 0 adds the step, the samples consumed and the
    model. A step saved again (a restart redoes it) stops counting as complete until ``finish``."""
    _unmark(step_dir(root, step))
    where = rank_dir(root, step, rank)
    objects = {}
    if rank == 0:
        objects = {"train.step": step, "train.consumed_samples": consumed_samples, "train.model": repr(spec.cfg)}
    planner = RowsSavePlanner(rank_chunks(spec, rank, state), objects)
    try:
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
            warnings.simplefilter("ignore")
            dcp.save({}, storage_writer=dcp.FileSystemWriter(where), planner=planner, no_dist=True)
    except (OSError, CheckpointException) as exc:
        raise ValueError(f"cannot write checkpoint files in {where}: {_why(exc)}") from None
    return where


def finish(root: str | Path, step: int, world: int, meta: dict | None = None) -> Path:
    """Rank 0, once every rank has saved (the caller's barrier): merge the ranks' DCP metadata
    into the step's ``.metadata``, then write the manifest, which makes checkpoint ``step``
    complete, then prune all but the last ``KEEP`` complete ones."""
    d = step_dir(root, step)
    absent = [rank_dir(root, step, r).name for r in range(world) if not (rank_dir(root, step, r) / METADATA).exists()]
    if absent:
        raise ValueError(f"checkpoint step {step} in {root} lacks {absent}: every rank must save before finish")
    for stale in d.glob("rank-*"):  # a larger layout saved this step before
        if not stale.name[5:].isdigit() or int(stale.name[5:]) >= world:
            shutil.rmtree(stale, ignore_errors=True)
    merged, results = _merge(root, step, world)
    problems = overlaps(merged) + [
        f"{fqn} lacks rows" for fqn, md in merged.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata) and missing_rows(md, None)
    ]  # fmt: skip
    if problems:
        raise ValueError(f"checkpoint step {step} in {root} is inconsistent: {problems[0]}")
    train = _train_record(root, step)
    try:
        dcp.FileSystemWriter(d).finish(merged, results)  # .metadata.tmp, then renamed
    except OSError as exc:
        raise ValueError(f"cannot write checkpoint file {d / METADATA}: {exc.strerror or exc}") from None
    manifest = {
        "format": FORMAT,
        "step": step,
        "world": world,
        "consumed_samples": train["consumed_samples"],
        "model": train["model"],
        "meta": meta or {},
        "chunks": sum(len(r) for r in results),
    }
    path = d / MANIFEST
    _atomic(path, json.dumps(manifest, indent=1).encode())
    _prune(root)
    return path


def _train_record(root: str | Path, step: int) -> dict:
    """Rank 0's step, samples consumed and model, read back with DCP's default planner."""
    train = {"train": {"step": -1, "consumed_samples": -1, "model": ""}}
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore")
            dcp.load(train, storage_reader=dcp.FileSystemReader(rank_dir(root, step, 0)), no_dist=True)
    except (Exception, CheckpointException) as exc:  # DCP's failure is a BaseException
        raise ValueError(
            f"checkpoint step {step} in {root}: rank-00000 holds no readable train record ({_why(exc)})"
        ) from None
    return train["train"]


def _merge(root: str | Path, step: int, world: int) -> tuple[Metadata, list[list[WriteResult]]]:
    """The ranks' metadata as one: every tensor's chunks in rank order, each chunk's storage
    entry pointing into its rank's folder (``rank-00003/__0_0.distcp``)."""
    tensors, others, planner_data, results = {}, {}, {}, []
    for r in range(world):
        md = _metadata(rank_dir(root, step, r))
        planner_data.update(md.planner_data or {})
        mine = []
        for fqn, item in md.state_dict_metadata.items():
            if not isinstance(item, TensorStorageMetadata):
                others[fqn] = item
                mine.append((MetadataIndex(fqn), MetadataIndex(fqn)))
                continue
            into = tensors.setdefault(fqn, TensorStorageMetadata(item.properties, item.size, []))
            if (into.size, into.properties.dtype) != (item.size, item.properties.dtype):
                raise ValueError(
                    f"checkpoint step {step} in {root} is inconsistent: rank {r} saved {fqn} as "
                    f"{list(item.size)} {item.properties.dtype}, an earlier rank as "
                    f"{list(into.size)} {into.properties.dtype}"
                )
            for c in item.chunks:
                mine.append((MetadataIndex(fqn, c.offsets), MetadataIndex(fqn, c.offsets, len(into.chunks))))
                into.chunks.append(c)
        prefix = rank_dir(root, step, r).name
        moved = [(new, md.storage_data[old]) for old, new in mine]
        results.append([
            WriteResult(new, info.length, replace(info, relative_path=f"{prefix}/{info.relative_path}"))
            for new, info in moved
        ])  # fmt: skip
    return Metadata(state_dict_metadata=tensors | others, planner_data=planner_data), results


def complete_steps(root: str | Path) -> list[int]:
    """Steps of the complete checkpoints under ``root`` (those with a manifest), ascending."""
    if not Path(root).is_dir():
        return []
    return sorted(
        int(d.name[5:]) for d in Path(root).glob("step-*") if (d / MANIFEST).exists() and d.name[5:].isdigit()
    )


def latest(root: str | Path) -> int | None:
    """The newest complete checkpoint's step; None when there is none."""
    steps = complete_steps(root)
    return steps[-1] if steps else None


def info(root: str | Path, step: int) -> dict:
    """Checkpoint ``step``'s manifest: format, step, world, consumed_samples, model, meta, chunks."""
    path = step_dir(root, step) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"checkpoint step {step} in {root} is not complete (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable checkpoint manifest ({type(exc).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not an ntp DCP checkpoint manifest")
    return manifest


def load(root: str | Path, step: int, spec: RunSpec, rank: int) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's state in ``spec``'s layout (as ``state.snapshot`` gives it, for
    ``state.install``), its rows read from whichever saved chunks hold them."""
    manifest = info(root, step)
    if manifest["model"] != repr(spec.cfg):
        raise ValueError(f"checkpoint step {step} holds the model {manifest['model']}, not {spec.cfg!r}")
    wants: dict[str, Rows] = {}
    for name, index in held(spec, rank).items():
        wants |= {f"{k}.{name}": index for k in STATE_KEYS} | {f"step.{name}": None}
    got = read_rows(step_dir(root, step), wants, f"checkpoint step {step} in {root}")
    return {
        name: {k: got[f"{k}.{name}"] for k in STATE_KEYS} | {"step": got[f"step.{name}"]} for name in held(spec, rank)
    }


def read_rows(d: Path, wants: dict[str, Rows], what: str) -> dict[str, torch.Tensor]:
    """fqn -> the rows ``wants`` names, read from the DCP checkpoint in ``d`` one data file at a
    time (DCP's load steps, driven here so that a damaged file is named)."""
    md = _metadata(d)
    for fqn, rows in wants.items():
        item = md.state_dict_metadata.get(fqn)
        if isinstance(item, TensorStorageMetadata):
            lost = missing_rows(item, rows)
        else:  # not saved at all
            lost = [None] if rows is None else list(rows[1])
        if lost:
            shown = "the whole tensor" if lost == [None] else f"rows {lost[:8]}" + (" ..." if len(lost) > 8 else "")
            raise ValueError(f"{what} has no copy of {shown} of {fqn.split('.', 1)[1]}")
    reader, planner = dcp.FileSystemReader(d), RowsLoadPlanner(wants)
    planner.set_up_planner({}, md, True)
    reader.set_up_storage_reader(md, True)
    per_file: dict[str, list] = {}
    for item in planner.create_local_plan().items:
        per_file.setdefault(md.storage_data[item.storage_index].relative_path, []).append(item)
    for relative, items in per_file.items():
        spans = [md.storage_data[i.storage_index] for i in items]
        path, end = d / relative, max(s.offset + s.length for s in spans)
        size = path.stat().st_size if path.exists() else None
        if size is None or size < end:
            state = "missing" if size is None else f"truncated ({size} of at least {end} bytes)"
            raise ValueError(f"{what}: its data file {relative} is {state}")
        try:
            reader.read_data(LoadPlan(items), planner).wait()
        except Exception as exc:  # torch.load raises many kinds (pickle, zip, runtime) for damaged bytes
            raise ValueError(f"{what}: its data file {relative} is damaged ({type(exc).__name__})") from None
    return planner.out


def _metadata(d: Path) -> Metadata:
    """The DCP metadata in ``d``, or one sentence saying why it cannot be read."""
    try:
        md = dcp.FileSystemReader(d).read_metadata()
    except FileNotFoundError:
        raise ValueError(f"{d} has no DCP metadata ({METADATA})") from None
    except Exception as exc:  # unpickling a damaged file raises many kinds
        raise ValueError(f"{d / METADATA} is not readable DCP metadata ({type(exc).__name__})") from None
    if not isinstance(md, Metadata):
        raise ValueError(f"{d / METADATA} is not DCP metadata (it holds a {type(md).__name__})")
    return md


def _why(exc: BaseException) -> str:
    """The first underlying error of a DCP failure, in a few words."""
    if isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).splitlines()[0]


def _unmark(d: Path) -> None:
    """Make step folder ``d`` incomplete (manifest first, then DCP's merged metadata)."""
    for name in (MANIFEST, METADATA):
        try:
            (d / name).unlink()
        except FileNotFoundError:
            pass
        except OSError:
            pass  # not a folder we can write: the save that follows names the reason


def _atomic(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file and ``os.replace``: readers see all of it or none."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise ValueError(f"cannot write checkpoint file {path}: {exc.strerror or exc}") from None


def _prune(root: str | Path) -> None:
    """Remove every step directory older than the last ``KEEP`` complete checkpoints (complete or not)."""
    kept = complete_steps(root)[-KEEP:]
    for d in Path(root).glob("step-*"):
        if d.name[5:].isdigit() and int(d.name[5:]) < kept[0]:
            shutil.rmtree(d, ignore_errors=True)
