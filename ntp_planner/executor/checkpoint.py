"""Checkpoints of one file per rank, loadable into any layout.

``torch.distributed.checkpoint`` describes a shard as one box of a global tensor per rank; NTP
holds uneven, head-aligned rows, and an uneven split replicates a cut KV head on two ranks, so
here each rank writes the rows it speaks for (it is their first holder in rank order: every row
is written once) with their indices, and a loader assembles whatever rows its layout needs from
whichever files hold them.

Layout on disk, one directory per step::

    DIR/step-00000040/rank-00000.pt ... rank-00007.pt   (written by each rank, atomically)
    DIR/step-00000040/manifest.json                      (written last by rank 0: the step is complete)

A rank file is ``{"format", "step", "rank", "consumed_samples", "model", "tensors"}``, ``tensors``
mapping a reference name to its cut ``dim`` and ``rows`` (None: the whole tensor) and the
``param``, ``exp_avg``, ``exp_avg_sq`` of those rows and AdamW's ``step``. The manifest lists
every file's rows (as [start, end) runs), so a loader opens only the files it needs. Only the
last ``KEEP`` complete checkpoints are kept; older directories go once a newer one is complete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ntp_planner.executor.elastic.state import STATE_KEYS, Index, held, select_rows
from ntp_planner.executor.spec import RunSpec

FORMAT = "ntp-rank-checkpoint/1"
MANIFEST = "manifest.json"
KEEP = 2  # complete checkpoints kept


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def rank_file(root: str | Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}.pt"


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


def save(root: str | Path, step: int, consumed_samples: int, spec: RunSpec, rank: int, state: dict) -> Path:
    """Write this rank's file of checkpoint ``step`` (``state``: its ``state.snapshot``)."""
    tensors = {}
    for name, (index, pos) in speaks(spec, rank).items():
        rows = select_rows(state[name], None if index is None else index[0], pos)
        tensors[name] = {
            "dim": None if index is None else index[0],
            "rows": None if index is None else torch.tensor(index[1], dtype=torch.long),
            **{k: rows[k].detach().cpu().contiguous() for k in STATE_KEYS},
            "step": torch.as_tensor(rows["step"]).detach().cpu().clone(),
        }
    payload = {
        "format": FORMAT,
        "step": step,
        "rank": rank,
        "consumed_samples": consumed_samples,
        "model": repr(spec.cfg),
        "tensors": tensors,
    }
    path = rank_file(root, step, rank)
    _atomic(path, lambda f: torch.save(payload, f))
    return path


def finish(root: str | Path, step: int, world: int, meta: dict | None = None) -> Path:
    """Rank 0, once every rank has saved (the caller's barrier): write the manifest, which makes
    checkpoint ``step`` complete, then prune all but the last ``KEEP`` complete ones."""
    files = [rank_file(root, step, r) for r in range(world)]
    absent = [f.name for f in files if not f.exists()]
    if absent:
        raise ValueError(f"checkpoint step {step} in {root} lacks {absent}: every rank must save before finish")
    index, first = {}, None
    for f in files:
        payload = _read(f)
        first = first or payload
        index[f.name] = {
            n: None if t["rows"] is None else _runs(t["rows"].tolist()) for n, t in payload["tensors"].items()
        }
    manifest = {
        "format": FORMAT,
        "step": step,
        "world": world,
        "consumed_samples": first["consumed_samples"],
        "model": first["model"],
        "meta": meta or {},
        "files": index,
    }
    path = step_dir(root, step) / MANIFEST
    _atomic(path, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    _prune(root)
    return path


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
    """Checkpoint ``step``'s manifest: step, world, consumed_samples, model, meta, files."""
    path = step_dir(root, step) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"checkpoint step {step} in {root} is not complete (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable checkpoint manifest ({type(exc).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not an ntp rank-checkpoint manifest")
    return manifest


def load(root: str | Path, step: int, spec: RunSpec, rank: int) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's state in ``spec``'s layout (as ``state.snapshot`` gives it, for
    ``state.install``), each row taken from whichever file holds it."""
    manifest = info(root, step)
    if manifest["model"] != repr(spec.cfg):
        raise ValueError(f"checkpoint step {step} holds the model {manifest['model']}, not {spec.cfg!r}")
    where: dict[str, dict] = {}  # name -> row -> (file, position in its piece)
    for fname, names in manifest["files"].items():
        for name, runs in names.items():
            rows = [None] if runs is None else [r for a, b in runs for r in range(a, b)]
            spot = where.setdefault(name, {})
            for i, row in enumerate(rows):
                spot.setdefault(row, (fname, i))
    opened: dict[str, dict] = {}
    out = {}
    for name, index in held(spec, rank).items():
        rows = [None] if index is None else list(index[1])
        lost = [r for r in rows if r not in where.get(name, {})]
        if lost:
            shown = "the whole tensor" if lost == [None] else f"rows {lost[:8]}" + (" ..." if len(lost) > 8 else "")
            raise ValueError(f"checkpoint step {step} in {root} has no copy of {shown} of {name}")
        out[name] = _assemble(root, step, name, index, [where[name][r] for r in rows], opened)
    return out


def _assemble(root, step, name: str, index: Index, spots: list, opened: dict) -> dict[str, torch.Tensor]:
    """One holding from (file, position) per row."""
    pieces = {}
    for fname in dict.fromkeys(f for f, _ in spots):
        if fname not in opened:
            opened[fname] = _read(step_dir(root, step) / fname)["tensors"]
        pieces[fname] = opened[fname][name]
    if index is None:
        (piece,) = pieces.values()
        return {k: piece[k].clone() for k in STATE_KEYS} | {"step": piece["step"].clone()}
    dim = index[0]
    out = {}
    for k in STATE_KEYS:
        parts = [pieces[f][k].select(dim, i) for f, i in spots]
        out[k] = torch.stack(parts, dim=dim)
    steps = {float(p["step"]) for p in pieces.values()}
    if len(steps) > 1:
        raise ValueError(f"checkpoint step {step}: {name} was saved at AdamW steps {sorted(steps)} by different ranks")
    return out | {"step": next(iter(pieces.values()))["step"].clone()}


def _read(path: Path) -> dict:
    """A rank file, or one clear sentence saying why it is not one."""
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise ValueError(f"rank checkpoint file {path} is missing") from None
    except Exception as exc:  # torch.load raises many kinds (pickle, zip, runtime) for a damaged file
        raise ValueError(f"{path} is not a readable rank checkpoint file ({type(exc).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not an ntp rank checkpoint file (its format is not {FORMAT})")
    return payload


def _atomic(path: Path, write) -> None:
    """Write ``path`` through a temporary file and ``os.replace``: readers see all of it or none."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise ValueError(f"cannot write checkpoint file {path}: {exc.strerror or exc}") from None


def _runs(rows: list[int]) -> list[list[int]]:
    """[start, end) runs of consecutive rows, in order.

    >>> _runs([0, 1, 2, 5, 6, 9])
    [[0, 3], [5, 7], [9, 10]]
    """
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        else:
            out.append([r, r + 1])
    return out


def _prune(root: str | Path) -> None:
    """Remove every step directory older than the last ``KEEP`` complete checkpoints (complete or not)."""
    kept = complete_steps(root)[-KEEP:]
    for d in Path(root).glob("step-*"):
        if d.name[5:].isdigit() and int(d.name[5:]) < kept[0]:
            shutil.rmtree(d, ignore_errors=True)
