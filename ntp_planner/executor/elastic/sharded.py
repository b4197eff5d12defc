"""How sharded training state reaches its new owners when a live run's layout changes: ZeRO 1-3
(AdamW's state, and under ZeRO-3 the weights, held as shards of a data-parallel group) and
expert parallelism (each pipeline of an EP group holds other experts).

``state`` moves whole rows of a parameter; a ZeRO shard is a run of the flattened core (a slice
of the TP slice, ``zero.shard_bounds``) and an expert-parallel rank holds a block of experts of
its TP slice, neither a set of rows of one dimension. So here the unit is one element of the
full (reference) tensor, named by its flat index. What a rank holds is read off the rank's own
``StageModel`` and ``ShardedOptimizer`` built on an *index model*, a reference whose every
parameter holds its flat indices (``holdings``): the holdings are those of the code that trains,
by construction, whatever slicing it does.

Each rank holds, per parameter, two tensors: the model's (``param``; nothing under ZeRO-3, whose
buffers are freed between steps) and the one AdamW updates (``opt``: the parameter itself at
ZeRO-0, the master shard from ZeRO-1, None where the rank holds no core). AdamW's moments live
with ``opt``. A source of an element is a process of both layouts whose old ``opt`` holds it:
after a committed step the masters are the truth (a peer lost in the all-gather after AdamW
leaves the parameters behind, never the masters), so parameters are rebuilt from masters too.
An element no live master holds is missing: its moments died with their only holder (ZeRO
keeps one copy), and the run loads the last checkpoint instead.

Worked example: TP2 x DP2 at ZeRO-1, the 48 x 16 FFN up projection (768 elements). TP rank 0 of
each replica holds rows 0..23 (flat 0..383); its group is (0, 2), so rank 0's master is flat
0..191 and rank 2's 192..383. Rank 2 dies and the survivors run TP2 on one replica at ZeRO-1,
group (0,): rank 0 needs opt 0..383; 0..191 are its own, 192..383 lived only on rank 2: missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.parallel.zero import ShardedOptimizer, uses_engine
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.stage import StageModel

MOMENTS = ("master", "exp_avg", "exp_avg_sq")  # what an "opt" piece carries, then AdamW's step


@dataclass(frozen=True)
class _Rank:
    """What the constructors of ``StageModel`` and ``ShardedOptimizer`` ask of a ``Comm``: the rank."""

    rank: int


@contextlib.contextmanager
def _float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_default_dtype(previous)


def holdings(spec: RunSpec, rank: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Reference name -> (flat indices of the full tensor in ``rank``'s ``param``, in ``opt``), in
    the order ``StageModel.named_parameters`` gives (ZeRO-3's ``param``: empty, freed)."""
    spec = dataclasses.replace(spec, dtype="float64")  # indices exact (float32 stops at 2**24)
    with _float64():
        ref = Reference(spec.cfg)
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(torch.arange(p.numel(), dtype=torch.float64).view(p.shape))
        replica, s = spec.locate(rank)
        model = StageModel(spec, spec.replicas[replica].stages[s], rank, ref, _Rank(rank), torch.device("cpu"))
        engine = ShardedOptimizer(spec, model, ref, _Rank(rank)) if uses_engine(spec) else None
    out = {}
    for i, (name, _, _, p) in enumerate(model.named_parameters()):
        opt = p if engine is None else engine.slots[i].master
        out[name] = (_flat(p), _flat(opt))
    return out


def _flat(t: torch.Tensor | None) -> np.ndarray:
    if t is None or t.untyped_storage().size() == 0:
        return np.zeros(0, dtype=np.int64)
    return t.detach().reshape(-1).numpy().astype(np.int64)


@dataclass(frozen=True)
class Piece:
    """Elements of one parameter from rank ``src``'s old ``opt`` into rank ``dst``'s new
    ``part`` ("param": the master values; "opt": master, exp_avg, exp_avg_sq and the step), at
    positions ``src_pos`` there and ``dst_pos`` here (new ranks; src == dst: a local copy)."""

    src: int
    dst: int
    name: str
    part: str
    src_pos: tuple[int, ...]
    dst_pos: tuple[int, ...]
    bytes: int = 0  # on the wire (0 for a local copy)


@dataclass(frozen=True)
class ShardPlan:
    """Everything a layout change does to sharded state, in the one order every rank posts it."""

    moves: tuple[Piece, ...]
    copies: tuple[Piece, ...]
    missing: tuple[tuple[str, int], ...]  # (name, elements no live source holds)
    held: tuple[dict[str, tuple[np.ndarray, np.ndarray]], ...]  # per new rank (``holdings``)

    @property
    def bytes_moved(self) -> int:
        return sum(m.bytes for m in self.moves)

    @property
    def elements_moved(self) -> int:
        return sum(len(m.dst_pos) for m in self.moves)


def plan_shards(old: RunSpec, old_procs: tuple[int, ...], new: RunSpec, new_procs: tuple[int, ...]) -> ShardPlan:
    """Which elements each new rank copies from its own old state and which it receives from
    which source. Per (destination, parameter, part): its own old ``opt`` first, then
    repeatedly the source holding the most of what is still needed (ties: fewest bytes sent so
    far, then one in the destination's replica, then the lowest rank)."""
    if len(old_procs) != old.world_size or len(new_procs) != new.world_size:
        raise ValueError(f"procs name every rank: {len(old_procs)} old for world {old.world_size}, "
                         f"{len(new_procs)} new for world {new.world_size}")  # fmt: skip
    old_rank = {p: r for r, p in enumerate(old_procs)}
    was = {r: holdings(old, old_rank[p]) for r, p in enumerate(new_procs) if p in old_rank}
    load = dict.fromkeys(was, 0)
    size = torch.empty(0, dtype=getattr(torch, new.dtype)).element_size()
    now = tuple(holdings(new, r) for r in range(new.world_size))
    moves, copies, missing = [], [], {}
    for dst, holding in enumerate(now):
        for name, (param, opt) in holding.items():
            for part, need in (("param", param), ("opt", opt)):
                per = size * (1 if part == "param" else len(MOMENTS))
                got, lost = _fetch(new, dst, name, part, need, was, load, per, size if part == "opt" else 0)
                copies += [g for g in got if g.src == dst]
                moves += [g for g in got if g.src != dst]
                if lost:
                    missing[name] = missing.get(name, 0) + lost
    return ShardPlan(tuple(moves), tuple(copies), tuple(missing.items()), now)


def _fetch(new, dst, name, part, need, was, load, per_element, per_message) -> tuple[list[Piece], int]:
    """The pieces bringing flat indices ``need`` of ``name`` to ``dst``, and how many no source holds."""
    left = np.arange(len(need))  # positions at dst still to fill
    out, replica = [], new.locate(dst)[0]
    while len(left):
        offers = {}
        for src, held_ in was.items():
            have = held_[name][1] if name in held_ else np.zeros(0, dtype=np.int64)
            hit = np.isin(need[left], have)
            if hit.any():
                offers[src] = (hit, have)
        if not offers:
            break
        src = min(offers, key=lambda s: (s != dst, -int(offers[s][0].sum()), load[s], new.locate(s)[0] != replica, s))
        hit, have = offers[src]
        order = np.argsort(have)
        at = order[np.searchsorted(have, need[left[hit]], sorter=order)]
        nbytes = 0 if src == dst else len(at) * per_element + per_message
        out.append(Piece(src, dst, name, part, tuple(at.tolist()), tuple(left[hit].tolist()), nbytes))
        load[src] += nbytes
        left = left[~hit]
    return out, len(left)


# ---- effects: the committed state, its transfer in the new process group, its installation ----
def flat_snapshot(tr) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's committed sharded state, cloned: per reference name the ``opt`` tensor's
    'master', 'exp_avg', 'exp_avg_sq' (flat; zeros before the first step) and AdamW's 'step'."""
    out = {}
    for name, t, state in _opt_tensors(tr):
        flat = t.detach().reshape(-1) if t is not None else torch.zeros(0)
        zeros = torch.zeros_like(flat)
        out[name] = {"master": flat.clone()} | {
            k: state.get(k, zeros).detach().reshape(-1).clone() for k in ("exp_avg", "exp_avg_sq")
        }
        out[name]["step"] = torch.tensor(float(state.get("step", 0.0)))
    return out


def _opt_tensors(tr):
    """(name, the tensor AdamW updates or None, its AdamW state) per parameter, in model order."""
    if tr.engine is None:
        for name, _, _, t in tr.model.named_parameters():
            yield name, t, tr.opt.state.get(t, {})
        return
    opt = tr.engine.opt
    for s in tr.engine.slots:
        yield s.name, s.master, ({} if s.master is None or opt is None else opt.state.get(s.master, {}))


def carry_shards(plan: ShardPlan, rank: int, old: dict, tr, start_step: int, timeout_s: float = 60.0) -> int:
    """Bring new rank ``rank``'s sharded state into ``tr`` (its ``step.Trainer``): local copies
    from ``old`` (this process's ``flat_snapshot``; {} for a newcomer), the rest point-to-point in
    the default process group, every rank posting in plan order; one message per piece. Returns
    bytes received."""
    if plan.missing:
        names = ", ".join(name for name, _ in plan.missing)
        raise ValueError(f"no surviving process holds some shards of {names}; load the last checkpoint instead")
    dtype = torch.get_default_dtype()
    new = {name: {"param": torch.zeros(len(p), dtype=dtype)} | {k: torch.zeros(len(o), dtype=dtype) for k in MOMENTS}
           | {"step": None} for name, (p, o) in plan.held[rank].items()}  # fmt: skip
    for c in plan.copies:
        if c.dst == rank:
            _put(new[c.name], _take(old[c.name], c), c)
    ops, received = [], []
    for m in plan.moves:
        if m.src == rank:
            ops.append(dist.P2POp(dist.isend, _pack(_take(old[m.name], m)), m.dst))
        elif m.dst == rank:
            n = len(m.dst_pos) * (1 if m.part == "param" else len(MOMENTS)) + (m.part == "opt")
            received.append((m, torch.empty(n, dtype=dtype)))
            ops.append(dist.P2POp(dist.irecv, received[-1][1], m.src))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait(timedelta(seconds=timeout_s))
    for m, buf in received:
        _put(new[m.name], _unpack(buf, m), m)
    install_flat(tr, new, start_step)
    return sum(buf.numel() * buf.element_size() for _, buf in received)


def _take(state: dict, piece: Piece) -> dict[str, torch.Tensor]:
    at = torch.tensor(piece.src_pos, dtype=torch.long)
    if piece.part == "param":
        return {"param": state["master"][at]}
    return {k: state[k][at] for k in MOMENTS} | {"step": state["step"]}


def _pack(got: dict[str, torch.Tensor]) -> torch.Tensor:
    if "param" in got:
        return got["param"].contiguous()
    dtype = got["master"].dtype
    return torch.cat([*(got[k] for k in MOMENTS), got["step"].to(dtype).reshape(1)])


def _unpack(buf: torch.Tensor, piece: Piece) -> dict[str, torch.Tensor]:
    if piece.part == "param":
        return {"param": buf}
    n = len(piece.dst_pos)
    return {k: buf[i * n : (i + 1) * n] for i, k in enumerate(MOMENTS)} | {"step": buf[-1]}


def _put(target: dict, got: dict[str, torch.Tensor], where: Piece) -> None:
    at = torch.tensor(where.dst_pos, dtype=torch.long)
    for k, v in got.items():
        if k != "step":
            target[k][at] = v.to(target[k].dtype)
    if "step" in got:
        step = float(got["step"])
        if target["step"] is not None and target["step"] != step:
            raise RuntimeError(f"{where.name}: pieces at AdamW steps {target['step']} and {step} (uncommitted state)")
        target["step"] = step


def install_flat(tr, state: dict, start_step: int) -> None:
    """Set ``tr``'s parameters and AdamW state from ``state`` (per name: flat 'param' over the
    model's tensor, 'master', 'exp_avg', 'exp_avg_sq' over the ``opt`` tensor, 'step'; a tensor
    that received nothing takes ``start_step``), so the next step continues exactly."""
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # AdamW's step dtype
    with torch.no_grad():
        for name, _, _, p in tr.model.named_parameters():
            if state[name]["param"].numel():
                p.view(-1).copy_(state[name]["param"])
        opt = tr.opt if tr.engine is None else tr.engine.opt
        for name, t, _ in _opt_tensors(tr):
            if t is None:
                continue
            s = state[name]
            t.view(-1).copy_(s["master"])
            step = start_step if s["step"] is None else s["step"]
            opt.state[t] = {"step": torch.tensor(float(step), dtype=scalar)} | {
                k: s[k].view(t.shape).clone() for k in ("exp_avg", "exp_avg_sq")
            }
