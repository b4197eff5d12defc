"""Which mover carries a live run's state across a layout change, and checkpoints of any run.

Row by row (``state``) where both layouts hold whole rows with a plain AdamW (ZeRO-0, no expert
parallelism of an MoE model): its plans name rows, as the checkpoint files do. Element by element
(``sharded``) otherwise: ZeRO 1-3 shards and expert-parallel blocks. A process keeps its
committed state as ``snapshot`` gives it, which either mover can read.

Checkpoints stay in rows (``checkpoint``): a sharded run all-gathers each shard's AdamW state
into the slices the rank holds, and an expert-parallel one its EP group's experts, before
writing (collectives every rank of the layout makes in one order), and loads the whole tensors
back to cut its holdings from them (``sharded.holdings``).
"""

from __future__ import annotations

import dataclasses

import torch

from ntp_planner.executor.elastic import sharded, state
from ntp_planner.executor.groups import ep_group
from ntp_planner.executor.model.moe import EXPERT_KEYS
from ntp_planner.executor.parallel.tensor import param_index
from ntp_planner.executor.spec import Block, ReplicaSpec, RunSpec, StageSpec


def by_rows(spec: RunSpec) -> bool:
    """Whether ``spec``'s ranks hold whole rows with their AdamW state (``state``'s unit)."""
    experts_split = spec.cfg.moe_layers and (spec.ep > 1 or spec.hosting or spec.etp is not None)
    return spec.zero == 0 and not experts_split


def plan(old: RunSpec, old_procs, new: RunSpec, new_procs) -> state.MovePlan | sharded.ShardPlan:
    """The move plan of a layout change (``missing`` names what no live process holds)."""
    if by_rows(old) and by_rows(new):
        return state.plan_moves(old, old_procs, new, new_procs)
    return sharded.plan_shards(old, old_procs, new, new_procs)


def snapshot(tr) -> dict:
    """This rank's committed state (``tr``: its ``step.Trainer``): rows with a plain AdamW, else flat."""
    if tr is None:
        return {}
    if tr.engine is None:
        return {"rows": state.snapshot(tr.model, tr.opt)}
    return {"flat": sharded.flat_snapshot(tr)}


def _flat(kept: dict) -> dict:
    """A kept state as ``sharded`` reads it (rows flattened: a plain AdamW's tensor is its parameter)."""
    if "flat" in kept or not kept:
        return kept.get("flat", {})
    return {
        name: {"master": s["param"].reshape(-1), "exp_avg": s["exp_avg"].reshape(-1),
               "exp_avg_sq": s["exp_avg_sq"].reshape(-1), "step": s["step"]}
        for name, s in kept["rows"].items()
    }  # fmt: skip


def carry(old: RunSpec, old_procs, new_procs, tr, kept: dict, start_step: int, timeout_s: float) -> int:
    """Bring the committed state from the old layout's live processes to ``tr``; bytes received."""
    moves = plan(old, old_procs, tr.spec, new_procs)
    if isinstance(moves, state.MovePlan):
        return state.carry(moves, tr.rank, kept.get("rows", {}), tr.model, tr.opt, timeout_s)
    return sharded.carry_shards(moves, tr.rank, _flat(kept), tr, start_step, timeout_s)


def checkpoint_spec(spec: RunSpec) -> RunSpec:
    """The layout a rank's checkpoint file is written in: ``spec``, every pipeline holding every
    expert (rows of one dimension per parameter, what the files name)."""
    return dataclasses.replace(spec, ep=1, etp=None, hosting=()) if spec.ep > 1 or spec.hosting else spec


def checkpoint_state(tr, steps_done: int) -> dict:
    """The rank's state in rows of ``checkpoint_spec``'s layout, as ``checkpoint.save`` writes it
    (``steps_done``: AdamW's step). Sharded runs gather each shard's state into the rank's slices
    and the experts of its EP group (collectives every rank makes in the same order)."""
    rows = state.snapshot(tr.model, tr.opt) if tr.engine is None else _gathered(tr.engine, steps_done)
    if tr.spec.hosting:
        _gather_hosted(tr, rows)
    elif tr.spec.etp is not None and tr.spec.ep > 1:
        raise ValueError(f"checkpoints of a folded run (etp {tr.spec.etp}) are not written; run without etp")
    elif tr.spec.ep > 1 and tr.spec.cfg.moe_layers:
        group = ep_group(tr.spec, tr.rank)
        for name, row in rows.items():
            if name.rsplit(".", 1)[-1] in EXPERT_KEYS:  # experts in EP-rank order: all of them
                for k in ("param", "exp_avg", "exp_avg_sq"):
                    row[k] = torch.cat(tr.comm.all_gather(row[k].contiguous(), group), dim=0)
    return rows


def _gathered_experts(tr, t: torch.Tensor, key: str, bs) -> torch.Tensor:
    """Every expert of ``t`` (the rank's whole experts, ``seat.mine``) gathered over its EP group
    (padded to the largest holding: the groups are uneven after a re-hosting), then the rank's
    TP slice of them at its block's degree (the checkpoint layout's)."""
    cfg, seat = tr.spec.cfg, tr.model.seat
    most = max(len(es) for es in seat.owned)
    padded = torch.cat([t, t.new_zeros((most - t.shape[0], *t.shape[1:]))])
    full = t.new_empty((cfg.experts, *t.shape[1:]))
    for part, es in zip(tr.comm.all_gather(padded.contiguous(), seat.ep_ranks), seat.owned, strict=True):
        if es:
            full[list(es)] = part[: len(es)]
    idx = param_index(cfg, key, bs.block.degree, bs.tp_rank)
    return full if idx is None else full.index_select(idx[0], torch.tensor(idx[1]))


def _gather_hosted(tr, rows: dict) -> None:
    """Under explicit hosting: each expert parameter's rows and AdamW moments in the checkpoint
    layout (``_gathered_experts``; the collectives in ``named_parameters`` order on every rank)."""
    for name, key, bs, _ in tr.model.named_parameters():
        if key in EXPERT_KEYS:
            for k in ("param", "exp_avg", "exp_avg_sq"):
                rows[name][k] = _gathered_experts(tr, rows[name][k], key, bs)


def _gathered(engine, steps_done: int) -> dict:
    """Every slot's parameter and AdamW moments in the rank's own slice, from the shards (the
    masters hold the committed parameters, ``sharded``)."""
    out, opt_state = {}, engine.opt.state if engine.opt is not None else {}
    with torch.no_grad():
        for s in engine.slots:
            row = {}
            for k in ("param", "exp_avg", "exp_avg_sq"):

                def part(m, k=k):
                    return m.detach() if k == "param" else opt_state.get(m, {}).get(k)

                core = engine._all_gather(s, part, s.param.dtype)
                row[k] = engine._distribute(s, core, torch.zeros(s.param.shape, dtype=s.param.dtype))
            out[s.name] = row | {"step": torch.tensor(float(steps_done))}
    return out


def load(root: str, step: int, tr) -> None:
    """Install checkpoint ``step`` into ``tr`` (any layout, any ZeRO level, any ep)."""
    from ntp_planner.executor import checkpoint

    if by_rows(tr.spec):
        state.install(tr.model, tr.opt, checkpoint.load(root, step, tr.spec, tr.rank))
        return
    whole = checkpoint.load(root, step, _one_rank(tr.spec), 0)
    flat = {}
    for name, (param, opt) in sharded.holdings(tr.spec, tr.rank).items():
        w = {k: v.reshape(-1) for k, v in whole[name].items() if k != "step"}
        flat[name] = {"param": w["param"][torch.from_numpy(param)], "step": float(whole[name]["step"])}
        for k, src in (("master", "param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
            flat[name][k] = w[src][torch.from_numpy(opt)]
    sharded.install_flat(tr, flat, step + 1)


def _one_rank(spec: RunSpec) -> RunSpec:
    """``spec``'s model on one rank at TP1: every parameter whole (what a loader asks for to cut shards)."""
    blocks = (Block("embed", -1, 1), *(Block("layer", i, 1) for i in range(spec.cfg.layers)), Block("head", -1, 1))
    return RunSpec(spec.cfg, (ReplicaSpec((StageSpec((0,), blocks),), 1),), micro_batch=1, seq_len=spec.seq_len)
