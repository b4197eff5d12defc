"""Gradient synchronisation across copies and replicas.

The loss is already scaled so that summing every rank's gradient gives the gradient of the
whole batch (samples weight themselves), so every sync is a sum.

- Every replica runs a block at one degree t: TP rank j sums over TP rank j of every copy of
  every replica (one all-reduce per parameter; KV heads cut by an uneven split first sum over
  their owners inside the copy).
- Degrees differ (NTP, shared/reference/ntp.md): each replica sums its copies, reshards its
  gradient to the layout of the smallest degree n (point-to-point inside the TP group: each
  rank sends only the rows another rank holds in the new layout, ``reshard``), core rank j < n
  all-reduces its slice 1:1 with core rank j of every other replica, the replica reshards the
  sum back to its own layout and copy 0 broadcasts it to the other copies.
- Routed experts under expert parallelism (``moe``): each held expert sums over the ranks
  holding the same slice of it (``groups.expert_seat``'s edp: before folding TP rank j of every
  copy in every pipeline at its place in an EP group; under folding the grid's edp group; under
  explicit hosting the expert's owners), whatever the replicas' TP degrees.
"""

from __future__ import annotations

import torch

from ntp_planner.executor.groups import dp_groups, expert_seat
from ntp_planner.executor.model.moe import EXPERT_KEYS
from ntp_planner.executor.parallel.comm import Comm
from ntp_planner.executor.parallel.reshard import reshard_plan
from ntp_planner.executor.parallel.tensor import cuts_kv_heads, param_index
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.stage import StageModel


def _place(t: torch.Tensor, idx, shape) -> torch.Tensor:
    full = t.new_zeros(shape)
    if idx is None:
        return full.copy_(t)
    return full.index_copy_(idx[0], torch.tensor(idx[1], device=t.device), t)


def _take(full: torch.Tensor, idx) -> torch.Tensor:
    return full.clone() if idx is None else full.index_select(idx[0], torch.tensor(idx[1], device=full.device))


def _with_cut_kv_summed(cfg, key: str, bs, grad: torch.Tensor, comm: Comm, shape) -> torch.Tensor:
    """For K and V (and their biases) split unevenly, each owner of a cut KV head holds part of
    its gradient: sum the parts over the copy's TP group (every owner then holds the whole).
    Others unchanged."""
    if not cuts_kv_heads(key) or not any(len(bs.shards.kv_owners(kv)) > 1 for kv in range(cfg.kv_heads)):
        return grad
    idx = param_index(cfg, key, bs.block.degree, bs.tp_rank)
    return _take(comm.all_reduce(_place(grad, idx, shape), bs.tp_ranks), idx)


def sync_gradients(model: StageModel, spec: RunSpec, stage: int, comm: Comm, shapes: dict) -> None:
    """Replace every gradient this rank holds with its sum over copies and replicas."""
    cfg = spec.cfg
    index = {id(bs): i for i, bs in enumerate(model.blocks)}
    for name, key, bs, p in model.named_parameters():
        b = index[id(bs)]
        t, j = bs.block.degree, bs.tp_rank
        degrees = [rep.stages[stage].blocks[b].degree for rep in spec.replicas]
        groups = dp_groups(spec, stage, b)
        if model.sp and param_index(cfg, key, t, j) is None:  # norms saw only this rank's tokens
            comm.all_reduce(p.grad, bs.tp_ranks)
        if key in EXPERT_KEYS and (spec.ep > 1 or spec.hosting):  # over the ranks holding the same experts
            p.grad = sum_experts(p.grad, expert_seat(spec, comm.rank, t).edp, comm)
            continue
        if len(set(degrees)) == 1:
            grad = _with_cut_kv_summed(cfg, key, bs, p.grad, comm, shapes[name])
            p.grad = comm.all_reduce(grad.contiguous(), groups[j])
            continue
        p.grad = _ntp_sync(model, spec, key, bs, p.grad, degrees, groups, comm, shapes[name])


def sum_experts(grad: torch.Tensor, edp: tuple[tuple[int, ...], ...], comm: Comm) -> torch.Tensor:
    """Each held expert's gradient (row i of ``grad``) summed over the ranks holding the same
    slice of it (``edp[i]``): one all-reduce per distinct set, rows of one set together."""
    out = grad.contiguous()
    for group in dict.fromkeys(edp):
        rows = [i for i, g in enumerate(edp) if g == group]
        if len(rows) == len(edp):
            return comm.all_reduce(out, group)
        idx = torch.tensor(rows, device=out.device)
        out = out.index_copy(0, idx, comm.all_reduce(out.index_select(0, idx).contiguous(), group))
    return out


def _ntp_sync(model, spec, key, bs, grad, degrees, groups, comm, shape) -> torch.Tensor:
    """NTP's sync of one parameter between replicas of different degrees (n = the smallest): the
    replica's gradient to the core layout (``ntp_core``), summed 1:1 between core rank j of every
    replica, and back to every holder (``ntp_spread``). The sharded optimizer (``zero``)
    runs the same two pieces around its reduce-scatter and all-gather instead of the all-reduce."""
    j = bs.tp_rank
    core = ntp_core(model, spec, key, bs, grad, comm, shape)
    if core is not None:
        comm.all_reduce(core, groups[0] if param_index(spec.cfg, key, bs.block.degree, j) is None else groups[j])
    return ntp_spread(model, spec, key, bs, core, grad, comm)


def smallest_degree(model: StageModel, spec: RunSpec, bs, comm: Comm) -> int:
    """n: the smallest degree any replica runs block ``bs`` (of this rank's stage) at."""
    b, stage = model.blocks.index(bs), spec.locate(comm.rank)[1]
    return min(rep.stages[stage].blocks[b].degree for rep in spec.replicas)


def ntp_core(model, spec, key, bs, grad, comm, shape) -> torch.Tensor | None:
    """A replica's gradient of one parameter in the core layout, that of the smallest degree n:
    its copies summed, the parts of a cut KV head summed, and on copy 0 resharded t -> n
    (point-to-point inside the TP group, ``reshard``). Returns the core slice on core rank j < n of
    copy 0 (a replicated norm: the whole gradient on core rank 0), None on every other rank."""
    cfg, stage = spec.cfg, model.stage
    t, j = bs.block.degree, bs.tp_rank
    comm.all_reduce(grad, stage.copy_dp_groups(t)[j])  # the replica's gradient: its copies add up
    idx = param_index(cfg, key, t, j)
    if idx is None:  # replicated: core rank 0 speaks for the replica
        return grad if bs.copy == 0 and j == 0 else None
    grad = _with_cut_kv_summed(cfg, key, bs, grad, comm, shape)
    if bs.copy:
        return None
    n = smallest_degree(model, spec, bs, comm)
    rows_n = len(param_index(cfg, key, n, j)[1]) if j < n else None
    core = comm.move(grad, reshard_plan(cfg, key, t, n), j, bs.tp_ranks, idx[0], rows_n, grad)  # t -> n layout
    return core


def ntp_spread(model, spec, key, bs, core, out, comm) -> torch.Tensor:
    """The core (the summed gradient, or the updated parameter) back into ``out`` on every holder
    of the slice: on copy 0 resharded n -> t, then broadcast to the other copies (a replicated
    norm: from core rank 0 to the whole stage)."""
    cfg, stage = spec.cfg, model.stage
    t, j = bs.block.degree, bs.tp_rank
    idx = param_index(cfg, key, t, j)
    if idx is None:
        if core is not None and core is not out:
            out.copy_(core)
        return comm.broadcast(out, stage.ranks[0], stage.ranks)
    if bs.copy == 0:
        n = smallest_degree(model, spec, bs, comm)
        moved = comm.move(core, reshard_plan(cfg, key, n, t), j, bs.tp_ranks, idx[0], len(idx[1]), out)  # n -> t
        if moved is not out:
            out.copy_(moved)
    return comm.broadcast(out.contiguous(), stage.ranks[j], stage.copy_dp_groups(t)[j])  # to the other copies
