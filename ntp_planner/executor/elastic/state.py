"""How training state reaches its new owners when the layout changes in a live run (recovery).

Processes keep an id for life (``procs[rank]``); a layout change renumbers ranks. The processes
that are ranks of the old layout and of the new one are the up-to-date sources: only they hold
the committed parameters and AdamW state and are in the new process group. Every parameter is
cut along one dimension (``tp_slices.CUTS``) into rows; a rank holds some rows of it (``held``).
For each new rank and parameter, the rows its process already held are copied locally, the
others come from one up-to-date holder, chosen to spread the load; rows no source holds are
``missing`` (the caller falls back to a checkpoint). This is the mover of runs that hold whole
rows with a plain AdamW (ZeRO-0, no expert parallelism); ZeRO shards and expert blocks move
element by element (``sharded``; ``handover`` picks).

Worked example, the FFN's up projection (48 rows) when process 3 of a lone TP4 replica on
processes (0, 1, 2, 3) dies and the survivors run it at TP3 (16 rows each). Process 0 held rows
0..11 and now holds 0..15: it copies its 12 and receives rows 12..15 (positions 0..3 of process 1's
old slice 12..23). Process 1 keeps 16..23 and receives 24..31 from process 2, which keeps
32..35; rows 36..47 lived only on process 3, so they are missing (with a healthy replica they
would come from it).

>>> from ntp_planner.executor.spec import TinyConfig, make_spec
>>> old = make_spec(TinyConfig(), [[4, 4, 4, 4]], [([4], 1)], 1, 4)
>>> new = make_spec(TinyConfig(), [[3, 3, 3, 3]], [([3], 1)], 1, 4)
>>> plan = plan_moves(old, (0, 1, 2, 3), new, (0, 1, 2))
>>> [(m.src, m.dst, m.src_pos, m.dst_pos) for m in plan.moves if m.name == "layers.0.up"]
[(1, 0, (0, 1, 2, 3), (12, 13, 14, 15)), (2, 1, (0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))]
>>> dict(plan.missing)["layers.0.up"]
(36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache

import torch
import torch.distributed as dist

from ntp_planner.executor.model.reference import Reference, block_params
from ntp_planner.executor.parallel.tensor import CUTS, param_index
from ntp_planner.executor.spec import RunSpec, TinyConfig

Index = tuple[int, tuple[int, ...]] | None  # (dimension, rows of the full tensor) or None: the whole tensor
STATE_KEYS = ("param", "exp_avg", "exp_avg_sq")  # the tensors carried per parameter (and AdamW's 'step')


def held(spec: RunSpec, rank: int) -> dict[str, Index]:
    """Reference parameter name -> the (dimension, rows) of the full tensor ``rank`` holds,
    None for a replicated one (the whole tensor), in the order ``StageModel`` holds them."""
    if spec.ep > 1 and spec.cfg.moe_layers:
        raise ValueError(f"carrying state under expert parallelism (ep {spec.ep}) is not supported; use ep 1")
    replica, s = spec.locate(rank)
    stage = spec.replicas[replica].stages[s]
    out: dict[str, Index] = {}
    for b in stage.blocks:
        _, tp_rank = stage.position(rank, b.degree)
        for key in block_params(spec.cfg, b.kind, b.layer):
            idx = param_index(spec.cfg, key, b.degree, tp_rank)
            out[f"{b.name}.{key}" if b.kind == "layer" else key] = None if idx is None else (idx[0], tuple(idx[1]))
    return out


@lru_cache(maxsize=32)
def shapes(cfg: TinyConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every reference parameter (built on the meta device; the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        return {name: tuple(p.shape) for name, p in Reference(cfg).named_parameters()}


def cut_dim(name: str) -> int | None:
    """The dimension parameter ``name`` is cut along (None: replicated)."""
    cut = CUTS[name.rsplit(".", 1)[-1]]
    return None if cut is None else cut[0]


def row_numel(cfg: TinyConfig, name: str) -> int:
    """Elements of one row of ``name`` along its cut (the whole tensor when replicated)."""
    shape, dim = shapes(cfg)[name], cut_dim(name)
    return math.prod(shape) // (1 if dim is None else shape[dim])


@dataclass(frozen=True)
class Piece:
    """Rows of one parameter that go from rank ``src``'s old tensor to rank ``dst``'s new one
    (new ranks; src == dst for a local copy). Positions are along ``dim``; None: the whole tensor."""

    src: int
    dst: int
    name: str
    src_pos: tuple[int, ...] | None  # positions in the source's old tensor
    dst_pos: tuple[int, ...] | None  # positions in the destination's new tensor
    bytes: int = 0  # on the wire: param, exp_avg, exp_avg_sq rows and the step (0 for a local copy)

    @property
    def rows(self) -> int:
        return 1 if self.src_pos is None else len(self.src_pos)


@dataclass(frozen=True)
class MovePlan:
    """Everything a layout change does to the state, in the one order every rank posts it."""

    moves: tuple[Piece, ...]  # point-to-point, in posting order
    copies: tuple[Piece, ...]  # within a process
    missing: tuple[tuple[str, tuple[int, ...] | None], ...]  # (name, rows no up-to-date source holds; None: whole)
    held: tuple[dict[str, Index], ...]  # per new rank, what it holds (``held``)

    @property
    def bytes_moved(self) -> int:
        return sum(m.bytes for m in self.moves)

    @property
    def rows_moved(self) -> int:
        return sum(m.rows for m in self.moves)

    @property
    def rows_copied(self) -> int:
        return sum(c.rows for c in self.copies)


def _rows(index: Index) -> tuple:
    """The units of a holding: its rows, or (None,) for a whole replicated tensor."""
    return (None,) if index is None else index[1]


def plan_moves(old: RunSpec, old_procs: tuple[int, ...], new: RunSpec, new_procs: tuple[int, ...]) -> MovePlan:
    """Which rows each new rank copies locally and which it receives from which source (new
    ranks of processes in both layouts). A source is chosen per (destination, parameter): among
    the sources holding all its missing rows, the one that has sent the fewest bytes so far,
    then one in the destination's replica, then the lowest rank; when none holds them all, the
    one holding the most of them, repeatedly."""
    if len(old_procs) != old.world_size or len(new_procs) != new.world_size:
        raise ValueError(
            f"procs name every rank: {len(old_procs)} old procs for world {old.world_size}, "
            f"{len(new_procs)} new procs for world {new.world_size}"
        )
    old_rank = {p: r for r, p in enumerate(old_procs)}
    sources = [r for r, p in enumerate(new_procs) if p in old_rank]  # new ranks, up to date
    was = {r: held(old, old_rank[new_procs[r]]) for r in sources}  # what each source held
    load = dict.fromkeys(sources, 0)
    moves, copies, missing = [], [], {}
    now = tuple(held(new, r) for r in range(new.world_size))
    for dst, holding in enumerate(now):
        for name, index in holding.items():
            mine = was.get(dst, {})
            kept = {row: i for i, row in enumerate(_rows(mine[name]))} if name in mine else {}
            want = {row: i for i, row in enumerate(_rows(index))}
            local = [row for row in want if row in kept]
            if local:
                copies.append(_piece(dst, dst, name, local, kept, want, 0))
            need = [row for row in want if row not in kept]
            got = _fetch(new, dst, name, need, want, was, load)
            moves += got
            lost = set(need).difference(*(_rows(was[m.src][name]) for m in got))
            if lost:
                missing.setdefault(name, set()).update(lost)
    gone = tuple((n, None if None in rows else tuple(sorted(rows))) for n, rows in missing.items())
    return MovePlan(tuple(moves), tuple(copies), gone, now)


def _fetch(new: RunSpec, dst: int, name: str, need: list, want: dict, was: dict, load: dict) -> list[Piece]:
    """The pieces that bring rows ``need`` of ``name`` to ``dst`` (``want``: row -> position
    there) from the sources (``was``: what each held; ``load``: bytes each has sent, updated)."""
    size = torch.empty(0, dtype=getattr(torch, new.dtype)).element_size()
    per_row = 3 * row_numel(new.cfg, name) * size  # param, exp_avg, exp_avg_sq; plus one step per message
    replica, out = new.locate(dst)[0], []
    while need:
        offers = {s: set(_rows(held_[name])) & set(need) for s, held_ in was.items() if name in held_}
        offers = {s: rows for s, rows in offers.items() if rows}
        if not offers:
            break
        src = min(offers, key=lambda s: (-len(offers[s]), load[s], new.locate(s)[0] != replica, s))
        rows = [row for row in need if row in offers[src]]
        spot = {row: i for i, row in enumerate(_rows(was[src][name]))}
        out.append(_piece(src, dst, name, rows, spot, want, len(rows) * per_row + size))
        load[src] += out[-1].bytes
        need = [row for row in need if row not in offers[src]]
    return out


def _piece(src: int, dst: int, name: str, rows: list, at_src: dict, at_dst: dict, nbytes: int) -> Piece:
    if rows == [None]:
        return Piece(src, dst, name, None, None, nbytes)
    return Piece(src, dst, name, tuple(at_src[r] for r in rows), tuple(at_dst[r] for r in rows), nbytes)


# ---- effects: the committed state, its transfer in the new process group, its installation ----
def snapshot(model, opt: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's committed state, cloned: per reference name its 'param', AdamW's 'exp_avg'
    and 'exp_avg_sq' (zeros before the first step) and 'step' (a scalar tensor)."""
    _check_adamw(opt)
    out = {}
    for name, _, _, t in model.named_parameters():
        state = opt.state.get(t, {})
        if "max_exp_avg_sq" in state:
            raise ValueError("carrying AdamW state with amsgrad is not supported; run without amsgrad")
        zeros = torch.zeros_like(t.detach())
        out[name] = {
            "param": t.detach().clone(),
            "exp_avg": state.get("exp_avg", zeros).detach().clone(),
            "exp_avg_sq": state.get("exp_avg_sq", zeros).detach().clone(),
            "step": torch.tensor(float(state.get("step", 0.0))),
        }
    return out


def carry(
    plan: MovePlan, rank: int, old_state: dict, model, opt: torch.optim.Optimizer, timeout_s: float = 60.0
) -> int:
    """Bring new rank ``rank``'s state to ``model`` (its new ``StageModel``) and ``opt`` (AdamW
    over the model's tensors): local copies from ``old_state`` (this process's ``snapshot``; {}
    for a newcomer), the rest point-to-point in the current default process group (the new
    layout's), every rank posting its sends and receives in plan order. Each move is one message:
    the param, exp_avg and exp_avg_sq rows flattened, then the step. Returns bytes received."""
    if plan.missing:
        names = ", ".join(name for name, _ in plan.missing)
        raise ValueError(f"no surviving process holds some rows of {names}; load the last checkpoint instead")
    tensors = {name: t for name, _, _, t in model.named_parameters()}
    if list(tensors) != list(plan.held[rank]):
        raise ValueError(f"the model does not hold what the plan gives rank {rank}: {list(tensors)}")
    new = {name: {k: torch.zeros_like(t.detach()) for k in STATE_KEYS} | {"step": None} for name, t in tensors.items()}
    filled = dict.fromkeys(tensors, 0)
    for c in plan.copies:
        if c.dst == rank:
            filled[c.name] += _put(new[c.name], select_rows(old_state[c.name], cut_dim(c.name), c.src_pos), c)
    ops, received = [], []
    for m in plan.moves:
        if m.src == rank:
            ops.append(dist.P2POp(dist.isend, _pack(select_rows(old_state[m.name], cut_dim(m.name), m.src_pos)), m.dst))
        elif m.dst == rank:
            buf = torch.empty(3 * _piece_shape(tensors[m.name], m).numel() + 1, dtype=tensors[m.name].dtype)
            ops.append(dist.P2POp(dist.irecv, buf, m.src))
            received.append((m, buf))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait(timedelta(seconds=timeout_s))
    for m, buf in received:
        filled[m.name] += _put(new[m.name], _unpack(buf, _piece_shape(tensors[m.name], m)), m)
    short = [n for n, t in tensors.items() if filled[n] != (1 if cut_dim(n) is None else t.shape[cut_dim(n)])]
    if short:
        raise RuntimeError(f"rank {rank}: the plan fills {short} incompletely (a bug in plan_moves)")
    install(model, opt, new)
    return sum(buf.numel() * buf.element_size() for _, buf in received)


def _check_adamw(opt) -> None:
    if type(opt) is not torch.optim.AdamW:
        raise ValueError(
            f"carrying state needs a plain torch.optim.AdamW over the rank's tensors, not {type(opt).__name__} "
            "(ZeRO and bf16 master weights are not supported)"
        )


def install(model, opt: torch.optim.Optimizer, state: dict[str, dict[str, torch.Tensor]]) -> None:
    """Set ``model``'s tensors (in place) and ``opt``'s AdamW state from ``state`` (per reference
    name, as ``snapshot`` gives), so the next ``opt.step()`` continues AdamW exactly."""
    _check_adamw(opt)
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # AdamW's step dtype
    with torch.no_grad():
        for name, _, _, t in model.named_parameters():
            s = state[name]
            t.copy_(s["param"])
            opt.state[t] = {
                "step": torch.tensor(float(s["step"]), dtype=scalar),
                "exp_avg": s["exp_avg"].to(t).clone(),
                "exp_avg_sq": s["exp_avg_sq"].to(t).clone(),
            }


def select_rows(
    state: dict[str, torch.Tensor], dim: int | None, pos: tuple[int, ...] | None
) -> dict[str, torch.Tensor]:
    """The positions ``pos`` along ``dim`` of one parameter's state (None: all of it); the step is shared."""
    if pos is None:
        return state
    at = torch.tensor(pos, dtype=torch.long)
    return {k: state[k].index_select(dim, at) for k in STATE_KEYS} | {"step": state["step"]}


def _pack(piece: dict[str, torch.Tensor]) -> torch.Tensor:
    p = piece["param"]
    return torch.cat([*(piece[k].to(p.dtype).reshape(-1) for k in STATE_KEYS), piece["step"].to(p.dtype).reshape(1)])


def _unpack(buf: torch.Tensor, shape: torch.Size) -> dict[str, torch.Tensor]:
    n = shape.numel()
    return {k: buf[i * n : (i + 1) * n].view(shape) for i, k in enumerate(STATE_KEYS)} | {"step": buf[-1]}


def _piece_shape(t: torch.Tensor, piece: Piece) -> torch.Size:
    if piece.dst_pos is None:
        return t.shape
    shape = list(t.shape)
    shape[cut_dim(piece.name)] = len(piece.dst_pos)
    return torch.Size(shape)


def _put(target: dict, piece: dict[str, torch.Tensor], where: Piece) -> int:
    """Write ``piece`` at ``where.dst_pos`` of ``target``; returns the rows written."""
    for k in STATE_KEYS:
        if where.dst_pos is None:
            target[k].copy_(piece[k])
        else:
            target[k].index_copy_(
                cut_dim(where.name), torch.tensor(where.dst_pos, dtype=torch.long), piece[k].to(target[k])
            )
    step = float(piece["step"])
    if target["step"] is not None and target["step"] != step:
        raise RuntimeError(f"{where.name}: pieces at AdamW steps {target['step']} and {step} (uncommitted state)")
    target["step"] = step
    return where.rows
