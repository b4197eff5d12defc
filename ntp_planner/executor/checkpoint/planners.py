"""``torch.distributed.checkpoint`` planners for row chunks: what a rank writes, what a rank reads.

DCP stores a global tensor as a list of boxes (``ChunkStorageMetadata``: offsets and sizes per
dimension), each box read back by its ``MetadataIndex(fqn, offsets)``. NTP cuts every parameter
along one dimension into uneven, head-aligned rows (``elastic.state.held``), so a run of
consecutive rows is a box: offset ``start`` and size ``n`` along the cut, the whole extent along
the other dimensions. Worked example, K of layer 0 (8 rows of 32, cut along dimension 0) at TP3:
rank 1 holds KV heads 0 and 1 (rows 0..7) but speaks only for KV head 1, so it writes one box,

>>> box((8, 32), 0, 4, 4)
ChunkStorageMetadata(offsets=torch.Size([4, 0]), sizes=torch.Size([4, 32]))

and rank 0, which held rows 0..3, wrote the box at offset 0. A reader at TP4 rank 2 wants rows
4..7: ``create_read_items_for_chunk_list`` finds the saved box at offset 4 and reads it whole.

The save planner takes the chunks and a few plain objects (the training step, samples consumed)
and writes them as they are; it never deduplicates (the caller writes every row once) and its
global plan refuses overlapping boxes, which DCP's own check also does when ranks save together.
The load planner fills one tensor per name with the rows a layout holds, in the order it holds
them, from whichever saved boxes contain them.
"""

from __future__ import annotations

import io
import math
from collections import ChainMap
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

Rows = tuple[int, tuple[int, ...]] | None  # (cut dimension, rows in holding order), None: the whole tensor


def box(size: tuple[int, ...], dim: int | None, start: int, n: int) -> ChunkStorageMetadata:
    """The DCP box of rows [start, start + n) along ``dim`` of a tensor of shape ``size``
    (``dim`` None: the whole tensor)."""
    offsets, sizes = [0] * len(size), list(size)
    if dim is not None:
        offsets[dim], sizes[dim] = start, n
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))


def runs(rows: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(position in the holding, first row, count) of each run of consecutive rows, in order.

    >>> runs((0, 1, 2, 5, 6, 9))
    [(0, 0, 3), (3, 5, 2), (5, 9, 1)]
    """
    out: list[list[int]] = []
    for pos, row in enumerate(rows):
        if out and out[-1][1] + out[-1][2] == row:
            out[-1][2] += 1
        else:
            out.append([pos, row, 1])
    return [tuple(r) for r in out]


@dataclass(frozen=True)
class Chunk:
    """Rows [start, start + data.shape[dim]) of the global tensor ``fqn`` of shape ``size``."""

    fqn: str  # "param.layers.0.k": the state key, then the reference parameter's name
    size: tuple[int, ...]  # the global tensor's shape
    dim: int | None  # the cut dimension; None: ``data`` is the whole tensor
    start: int
    data: torch.Tensor  # contiguous, its own storage (torch.save writes a view's whole storage)

    @property
    def box(self) -> ChunkStorageMetadata:
        return box(self.size, self.dim, self.start, 1 if self.dim is None else self.data.shape[self.dim])


def nesting(fqn: str) -> tuple[str, str]:
    """DCP's flattening map for ``fqn``: ``dcp_to_torch_save`` rebuilds {"param": {name: tensor}}.

    >>> nesting("exp_avg.layers.0.k")
    ('exp_avg', 'layers.0.k')
    """
    group, name = fqn.split(".", 1)
    return group, name


class RowsSavePlanner(SavePlanner):
    """Writes ``chunks`` and ``objects`` (fqn -> picklable value) as given: the state_dict DCP
    passes in is unused, the chunks are the state."""

    def __init__(self, chunks: list[Chunk], objects: dict[str, Any]):
        self._chunks = {(c.fqn, tuple(c.box.offsets)): c for c in chunks}
        self._objects = dict(objects)

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator: bool = False) -> None:
        pass

    def create_local_plan(self) -> SavePlan:
        items = [
            WriteItem(
                index=MetadataIndex(c.fqn, c.box.offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=c.box, properties=TensorProperties.create_from_tensor(c.data), size=torch.Size(c.size)
                ),
            )
            for c in self._chunks.values()
        ]
        items += [WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO) for fqn in self._objects]
        fqns = {c.fqn for c in self._chunks.values()} | set(self._objects)
        return SavePlan(items, planner_data={fqn: nesting(fqn) for fqn in fqns})

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        plans, metadata = create_default_global_save_plan(all_plans)
        metadata = replace(metadata, planner_data=dict(ChainMap(*(p.planner_data or {} for p in all_plans))))
        problems = overlaps(metadata)
        if problems:
            raise ValueError(f"rows would be written twice: {problems[0]}")
        return plans, metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        if write_item.type == WriteItemType.BYTE_IO:
            buf = io.BytesIO()
            torch.save(self._objects[write_item.index.fqn], buf)
            return buf
        return self._chunks[(write_item.index.fqn, tuple(write_item.index.offset))].data


def overlaps(metadata: Metadata) -> list[str]:
    """Each pair of boxes of one tensor that share an element (a row written twice), as text."""
    out = []
    for fqn, md in metadata.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        boxes = md.chunks
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                if all(
                    oa < ob + sb and ob < oa + sa
                    for oa, sa, ob, sb in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
                ):
                    out.append(f"the chunks of {fqn} at {list(a.offsets)} and {list(b.offsets)} overlap")
    return out


def missing_rows(md: TensorStorageMetadata, rows: Rows) -> list[int | None]:
    """The rows of ``rows`` no saved box of ``md`` holds whole ([None]: the whole tensor is not
    covered); boxes are full along every dimension but the cut, as ``box`` makes them."""
    if rows is None:
        covered = sum(math.prod(c.sizes) for c in md.chunks)
        return [] if covered == math.prod(md.size) else [None]
    dim, wanted = rows
    have = set()
    for c in md.chunks:
        if all(c.sizes[d] == md.size[d] for d in range(len(md.size)) if d != dim):
            have.update(range(c.offsets[dim], c.offsets[dim] + c.sizes[dim]))
    return [r for r in wanted if r not in have]


class RowsLoadPlanner(LoadPlanner):
    """Reads, for each fqn of ``wants``, the rows it names into ``out[fqn]`` (a new tensor, the
    rows in the order given). The caller checks ``missing_rows`` first: a row no box holds stays
    unread."""

    def __init__(self, wants: dict[str, Rows]):
        self._wants = dict(wants)
        self.out: dict[str, torch.Tensor] = {}

    def set_up_planner(self, state_dict, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        self._metadata = metadata
        self._views: dict[tuple, torch.Tensor] = {}
        self._boxes: dict[str, list[ChunkStorageMetadata]] = {}
        for fqn, rows in self._wants.items():
            md = metadata.state_dict_metadata[fqn]
            shape = list(md.size)
            if rows is not None:
                shape[rows[0]] = len(rows[1])
            self.out[fqn] = t = torch.empty(shape, dtype=md.properties.dtype)
            pieces = [(0, 0, 0)] if rows is None else runs(rows[1])
            for pos, start, n in pieces:
                b = box(tuple(md.size), None if rows is None else rows[0], start, n)
                self._views[(fqn, tuple(b.offsets))] = t if rows is None else t.narrow(rows[0], pos, n)
                self._boxes.setdefault(fqn, []).append(b)

    def create_local_plan(self) -> LoadPlan:
        items: list[ReadItem] = []
        for fqn, boxes in self._boxes.items():
            items += create_read_items_for_chunk_list(fqn, self._metadata.state_dict_metadata[fqn], boxes)
        return LoadPlan(items)

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise AssertionError(f"RowsLoadPlanner reads tensors only, not {read_item.dest_index.fqn}")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        view = self._views[(read_item.dest_index.fqn, tuple(read_item.dest_index.offset))]
        for d, (offset, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths, strict=True)):
            view = view.narrow(d, offset, length)
        return view

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass  # ``resolve_tensor`` gave a view of ``out``: the reader copied into it in place
