"""The optimizer step of a run: Megatron's distributed optimizer (ZeRO-1), ZeRO-2 and ZeRO-3, and
bf16 mixed precision with fp32 master weights and fp32 gradients.

Every slice of a parameter a rank holds is summed over one data-parallel group (``data``): TP
rank j of every copy of every replica when the replicas run the block at one degree; under NTP,
after each replica has summed its copies and resharded to the smallest degree n, core rank
j < n of copy 0 of every replica (a replicated norm: core rank 0). That group's sum is its
"core" tensor. The sharded optimizer replaces the all-reduce of the core gradient with a
reduce-scatter of the flattened core (padded to a multiple of the group size g), member i runs
AdamW on elements [i s, (i + 1) s) (s = ceil(numel / g); the padding is never updated), and an
all-gather of the updated shards rebuilds the core parameter, which then goes back the way the
gradient came (under NTP resharded n -> t and broadcast to the copies). AdamW is elementwise, so
the result is the replicated optimizer's.

Worked example: a 48-element core over a group of 4 ranks: shards of 12, rank 2 updates 24..35;
a 50-element core: shards of 13, the last rank updates 39..49 (11 elements, 2 of padding).

>>> shard_bounds(48, 4, 2), shard_bounds(50, 4, 3)
((24, 36), (39, 50))

Levels (as the cost model, ``cost_models.layout.ParallelLayout.zero``): 1 keeps the full
gradient buffer and shards AdamW's state; 2 also drops the full gradient after the
reduce-scatter (only the shard's gradient is held); 3 also holds parameters as shards
(``fsdp``). ZeRO-1 reduce-scatters once per step, after the last micro-batch; ZeRO-2 and 3
reduce-scatter every micro-batch's gradient as it leaves a block's backward (``fsdp``), where the
replicas hold each block alike and run as many micro-batches (else ZeRO-2 reduces once per step:
the same bytes held after the step, fewer calls). One reduce-scatter and one all-gather per
parameter tensor. With float32/float64 parameters a rank's shard of its own slice is a view of the
parameter (no copy, as Megatron's distributed optimizer without a main-parameter copy); under
NTP the core is in the n layout, so its shard is a tensor of its own.

Mixed precision (``dtype="bfloat16"``): parameters and activations in bf16; every micro-batch's
bf16 gradient is added into an fp32 buffer (Megatron's main_grad) and reduced in fp32; AdamW runs
on fp32 master weights (sharded by the ZeRO level; ZeRO-0 keeps them whole on every core rank)
and the result is cast back to bf16. ``runtime.reference_run`` does the same in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ntp_planner.executor.groups import dp_groups, expert_dp_group
from ntp_planner.executor.model.moe import EXPERT_KEYS
from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.parallel.comm import Comm
from ntp_planner.executor.parallel.data import _with_cut_kv_summed, ntp_core, ntp_spread
from ntp_planner.executor.parallel.tensor import param_index, rank_slice
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.stage import StageModel

ADAMW = {"weight_decay": 0.01}
MASTER_DTYPE = {"bfloat16": "float32"}  # parameters in bf16 keep fp32 master weights and gradients


def default_dtype(spec: RunSpec) -> torch.dtype:
    """The dtype the model is built in (and its master weights kept in)."""
    return getattr(torch, MASTER_DTYPE.get(spec.dtype, spec.dtype))


def shard_bounds(numel: int, group: int, index: int) -> tuple[int, int]:
    """[start, end) of member ``index``'s shard of a flattened ``numel``-element tensor over
    ``group`` ranks (equal shards of ceil(numel / group), the last ones cut at ``numel``)."""
    size = -(-numel // group)
    return min(index * size, numel), min((index + 1) * size, numel)


@dataclass
class Slot:
    """One parameter slice of this rank and its part in the optimizer."""

    name: str
    key: str
    bs: object  # stage.BlockState
    param: torch.Tensor  # the model's tensor
    group: tuple[int, ...] | None  # the ranks summing its core; None: this rank holds no core
    ntp: bool  # replicas hold it at different degrees: the core is in the smallest degree's layout
    full_shape: tuple[int, ...]  # the reference parameter's
    core_shape: tuple[int, ...] = ()
    master: torch.Tensor | None = None  # this rank's shard (leaf AdamW updates); None if empty or no core
    low: torch.Tensor | None = None  # ZeRO-3 in mixed precision: the shard's bf16 copy, what is gathered


class ShardedOptimizer:
    """AdamW over this rank's shards (``spec.zero`` >= 1) or over whole fp32 masters (bf16 at
    ZeRO-0): ``zero_grad``, ``reduce`` (gradients to shards), ``step`` (AdamW), ``gather``
    (updated shards back into the model's parameters)."""

    def __init__(self, spec: RunSpec, model: StageModel, ref: Reference, comm: Comm):
        self.spec, self.model, self.comm, self.cfg = spec, model, comm, spec.cfg
        self.mixed = spec.dtype in MASTER_DTYPE
        self.main_grads: dict[int, torch.Tensor | None] = {}
        full = dict(ref.named_parameters())
        # the slices as built (the model's dtype): a uniform slot's core, whatever the block cuts
        built = {(id(bs), k): t.detach() for bs in model.blocks for k, t in bs.params.items()}
        self.per_micro_batch = per_micro_batch(spec)
        if self.mixed or self.per_micro_batch:  # full buffers, gathered from the shards (``fsdp``)
            make = (lambda t: t.detach().clone()) if self.per_micro_batch else _leaf
            for bs in model.blocks:
                bs.params = {k: make(t.detach().to(getattr(torch, spec.dtype))) for k, t in bs.params.items()}
        index = {id(bs): i for i, bs in enumerate(model.blocks)}
        self.slots = []
        for name, key, bs, p in model.named_parameters():
            slot = self._slot(name, key, bs, p, index[id(bs)], full[name], built[id(bs), key])
            self.slots.append(slot)
            if self.mixed and not self.per_micro_batch:
                self.main_grads[id(p)] = None
                p.register_post_accumulate_grad_hook(self._accumulate)
        masters = [s.master for s in self.slots if s.master is not None]
        self.opt = torch.optim.AdamW(masters, lr=spec.lr, **ADAMW) if masters else None
        self.zero3 = None
        if self.per_micro_batch:
            from ntp_planner.executor.parallel.fsdp import BlockShards

            self.zero3 = model.around = BlockShards(self)

    # ---- set-up -----------------------------------------------------------------------------
    def _slot(self, name, key, bs, p, b, full: torch.Tensor, own: torch.Tensor) -> Slot:
        """Which group sums the slice, which shard of its core this rank updates, and its master."""
        spec, cfg = self.spec, self.cfg
        t, j = bs.block.degree, bs.tp_rank
        s = spec.locate(self.comm.rank)[1]
        degrees = {rep.stages[s].blocks[b].degree for rep in spec.replicas}
        groups, n = dp_groups(spec, s, b), min(degrees)
        slot = Slot(name, key, bs, p, None, len(degrees) > 1, tuple(full.shape))
        if not slot.ntp:  # routed experts under EP: the ranks holding the same experts (as ``data``)
            expert = spec.ep > 1 and key in EXPERT_KEYS
            slot.group, core = (expert_dp_group(spec, self.comm.rank, t) if expert else groups[j]), own
        elif bs.copy == 0 and param_index(cfg, key, t, j) is None and j == 0:  # a norm: core rank 0 speaks
            slot.group, core = groups[0], full
        elif bs.copy == 0 and param_index(cfg, key, t, j) is not None and j < n:
            slot.group, core = groups[j], rank_slice(full, cfg, key, n, j)
        else:
            return slot
        slot.core_shape = tuple(core.shape)
        g = len(slot.group) if spec.zero else 1
        i = sorted(slot.group).index(self.comm.rank) if spec.zero else 0  # collectives order by group rank
        a, e = shard_bounds(core.numel(), g, i)
        if a == e and not self.per_micro_batch:  # ``fsdp`` keeps an empty shard: every slice of a block has its leaf
            return slot
        if self.mixed or slot.ntp or spec.zero >= 3:
            slot.master = _leaf(core.detach().reshape(-1)[a:e].clone().to(default_dtype(spec)))
        else:  # a view of the parameter itself: AdamW writes straight into it
            slot.master = p.detach().view(-1)[a:e]
            if self.per_micro_batch:  # ZeRO-2's buffer: the shard is the leaf ``fsdp.Gather`` gives gradients
                slot.master.requires_grad_(True)
        if self.mixed and spec.zero >= 3:
            slot.low = slot.master.detach().to(p.dtype)
        return slot

    def _accumulate(self, p: torch.Tensor) -> None:
        """Mixed precision: add a micro-batch's bf16 gradient into the fp32 buffer."""
        buf = self.main_grads[id(p)]
        if buf is None:
            buf = self.main_grads[id(p)] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        buf.add_(p.grad)
        p.grad = None

    # ---- a step -----------------------------------------------------------------------------
    def zero_grad(self) -> None:
        for s in self.slots:
            s.param.grad = None
            if s.master is not None:
                s.master.grad = None
            if self.mixed and self.main_grads.get(id(s.param)) is not None:
                if self.spec.zero >= 2:
                    self.main_grads[id(s.param)] = None
                else:
                    self.main_grads[id(s.param)].zero_()

    def _grad(self, s: Slot) -> torch.Tensor:
        g = self.main_grads[id(s.param)] if self.mixed else s.param.grad
        return g if g is not None else torch.zeros(s.param.shape, dtype=_master(self.spec), device=s.param.device)

    def reduce(self) -> None:
        """Every slot's gradient summed over its group, this rank keeping its shard (``master.grad``;
        ZeRO-3 has reduce-scattered every micro-batch's already)."""
        if self.zero3 is not None:
            return
        for s in self.slots:
            core = self._core_grad(s)
            if core is not None:
                shard = self._reduce_scatter(s, core)
                if s.master is not None:
                    s.master.grad = shard[: s.master.numel()].to(s.master.dtype)
            if self.spec.zero >= 2:  # the full gradient is not kept
                s.param.grad = None
                if self.mixed:
                    self.main_grads[id(s.param)] = None

    def _core_grad(self, s: Slot) -> torch.Tensor | None:
        """The rank's part of the gradient in the core layout (None: it holds no core)."""
        model, comm, cfg = self.model, self.comm, self.cfg
        bs, grad = s.bs, self._grad(s)
        t, j = bs.block.degree, bs.tp_rank
        idx = param_index(cfg, s.key, t, j)
        if model.sp and idx is None:  # norms saw only this rank's tokens
            comm.all_reduce(grad, bs.tp_ranks)
        if not s.ntp:
            return _with_cut_kv_summed(cfg, s.key, bs, grad, comm, s.full_shape)
        return ntp_core(model, self.spec, s.key, bs, grad, comm, s.full_shape)  # the all-reduce's path too

    def _reduce_scatter(self, s: Slot, core: torch.Tensor) -> torch.Tensor:
        flat = core.reshape(-1).to(_master(self.spec))
        g = len(s.group)
        if not self.spec.zero:
            return self.comm.all_reduce(flat.contiguous(), s.group)
        size = -(-flat.numel() // g)
        flat = F.pad(flat, (0, size * g - flat.numel()))
        if g == 1:
            return flat
        return self.comm.reduce_scatter(flat.new_empty(size), list(flat.split(size)), s.group, None)

    def step(self) -> None:
        if self.opt is not None:
            self.opt.step()
        if self.spec.zero == 1:  # the shard's gradient is transient (Megatron: a view of the full buffer)
            for s in self.slots:
                if s.master is not None:
                    s.master.grad = None

    def gather(self) -> None:
        """The updated shards all-gathered into the core, and the core back into every holder
        (ZeRO-3: gathered before each use instead; in mixed precision the bf16 shards are cast)."""
        if self.zero3 is not None:
            for s in self.slots:
                if s.low is not None:
                    s.low.copy_(s.master.detach())
            if self.spec.zero < 3:  # ZeRO-2: the parameters are gathered once per step
                for bs in self.model.blocks:
                    self.zero3.fill(bs)
            return
        with torch.no_grad():
            for s in self.slots:
                self._distribute(s, self._all_gather(s, lambda m: m.detach()))

    def synced_grads(self):
        """Every parameter's summed gradient in its own layout (for the comparison, between
        ``reduce`` and ``step``), rebuilt from the shards: a function of the parameter's name."""
        out = {}
        for s in self.slots:
            dtype = _master(self.spec)
            got = self._all_gather(s, lambda m: m.grad, dtype)
            out[s.name] = self._distribute(s, got, torch.empty(s.param.shape, dtype=dtype, device=s.param.device))
        return out.__getitem__

    def _all_gather(self, s: Slot, part, dtype=None) -> torch.Tensor | None:
        """The core tensor from every member's ``part(master)`` (None where the rank holds no core)."""
        if s.group is None:
            return None
        dtype = dtype or s.param.dtype
        numel = 1
        for d in s.core_shape:
            numel *= d
        g = len(s.group) if self.spec.zero else 1
        size = -(-numel // g)
        mine = torch.zeros(size, dtype=dtype, device=s.param.device)
        if s.master is not None and part(s.master) is not None:
            mine[: s.master.numel()] = part(s.master).to(dtype)
        parts = self.comm.all_gather(mine, s.group) if g > 1 else [mine]
        return torch.cat(parts)[:numel].view(s.core_shape)

    def _distribute(self, s: Slot, core: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
        """``core`` (the updated parameter, or the summed gradient) into ``out`` (default: the
        parameter) on every rank holding the slice: resharded n -> t and broadcast under NTP."""
        out = s.param.detach() if out is None else out
        if not s.ntp:
            return out.copy_(core.view(out.shape))
        return ntp_spread(self.model, self.spec, s.key, s.bs, core, out, self.comm)  # as the all-reduce's

    def materialize(self) -> None:
        """ZeRO-3: every full parameter gathered into the model (for the final comparison)."""
        if self.zero3 is not None:
            self.zero3.materialize()

    # ---- what the rank holds ----------------------------------------------------------------
    def held_bytes(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer state) bytes this rank holds between steps: the
        model's parameters (ZeRO-3: their shards); full gradients (fp32 buffers in mixed
        precision) and, from ZeRO-2, the shards' gradients; AdamW's moments and the master shards
        that are not the weights themselves (fp32 masters, NTP's cores in the smallest layout)."""
        masters = [s for s in self.slots if s.master is not None]
        if self.spec.zero < 3:
            weights = sum(_nbytes(s.param) for s in self.slots)
            own = sum(_nbytes(s.master) for s in masters if s.master._base is None)
        else:
            weights = sum(_nbytes(s.low if self.mixed else s.master) for s in masters)
            own = sum(_nbytes(s.master) for s in masters) if self.mixed else 0
        grads = sum(_nbytes(self.main_grads.get(id(s.param)) if self.mixed else s.param.grad) for s in self.slots)
        grads += sum(_nbytes(s.master.grad) for s in masters if self.spec.zero >= 2)
        state = [v for st in (self.opt.state.values() if self.opt else ()) for k, v in st.items() if k != "step"]
        return weights, grads, sum(_nbytes(v) for v in state) + own


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().requires_grad_(True)


def _master(spec: RunSpec) -> torch.dtype:
    return default_dtype(spec)


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def per_micro_batch(spec: RunSpec) -> bool:
    """Whether gradients are reduce-scattered every micro-batch (``fsdp``): ZeRO-3, and ZeRO-2
    where every replica holds each block at one degree and runs as many micro-batches (each
    reduce-scatter is a collective every member makes equally often)."""
    if spec.zero < 2:
        return False
    degrees = {tuple(b.degree for st in rep.stages for b in st.blocks) for rep in spec.replicas}
    return spec.zero >= 3 or (len(degrees) == 1 and len({rep.micro_batches for rep in spec.replicas}) == 1)


def uses_engine(spec: RunSpec) -> bool:
    """Whether the run's optimizer is ``ShardedOptimizer`` (ZeRO >= 1 or mixed precision)."""
    return spec.zero >= 1 or spec.dtype in MASTER_DTYPE
