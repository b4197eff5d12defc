"""The executor's blocks, forward and backward, at one TP rank's shard shape.

A block is run by ``executor.stage.StageModel.forward`` itself, on a stage that holds only that
block, with the stage's collectives replaced by ``LocalComm`` (same shapes, no wire): what is
timed is the executor's code (``tp_slices.rank_attention`` / ``rank_mlp``, the vocabulary-parallel
lookup, the LM head with its full-vocabulary cross-entropy) on TP rank 0, which holds the largest
shard when a degree splits the heads unevenly. The weights are made at the shard's shape directly
(``tp_slices.param_index`` gives it), so a 70B layer never allocates the whole model. An MoE layer
runs ``expert.rank_moe`` with every expert on the rank (ep 1: no all-to-all, which ``collectives``
times; the expert rows a rank computes, tokens x top-k, are the same under any ep with balanced
routing). A shape names no shared expert (``BlockShape`` has no width for it): a model's shared
expert is not in the measured time.

Backward is autograd's backward of the block's output with a random upstream gradient (the
loss itself for the LM head), timed on its own after an untimed forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from cost_models.profile import BlockShape, BlockTime
from ntp_planner.executor.model.reference import block_params
from ntp_planner.executor.parallel.comm import AllGatherSeq
from ntp_planner.executor.parallel.expert import ExpertPlace
from ntp_planner.executor.parallel.ownership import contiguous, layer_shards
from ntp_planner.executor.parallel.tensor import param_index
from ntp_planner.executor.spec import Block, TinyConfig, make_spec
from ntp_planner.executor.train.stage import BlockState, StageModel
from ntp_planner.profiler.local_comm import LocalComm
from ntp_planner.profiler.timing import median_time, threads
from topologies.errors import InputError

BlockRequest = tuple[BlockShape, int]  # (shape, micro-batch)

# profile kind -> executor kind; kinds missing here are not run (the reason is in SKIPPED)
EXECUTOR_KIND = {"embedding": "embed", "layer": "layer", "moe_layer": "layer", "head": "head"}
SKIPPED: dict[str, str] = {}


def tiny_config(shape: BlockShape) -> TinyConfig:
    """The executor's model config for ``shape`` (one layer); InputError where the executor's
    layer cannot take the shape."""
    if shape.heads * shape.head_dim != shape.hidden:
        raise InputError(
            f"the executor's layer needs hidden = heads * head_dim, but {shape.heads} * {shape.head_dim} = "
            f"{shape.heads * shape.head_dim} != {shape.hidden}"
        )
    if shape.heads % shape.kv_heads:
        raise InputError(f"heads ({shape.heads}) must be a multiple of kv_heads ({shape.kv_heads})")
    if shape.tp > min(shape.heads, shape.ffn, shape.vocab):
        raise InputError(f"TP degree {shape.tp} exceeds the model's {shape.heads} heads")
    moe = (
        {"experts": shape.experts, "top_k": shape.top_k, "expert_ffn": shape.ffn, "moe_layers": (0,)}
        if shape.kind == "moe_layer"
        else {}
    )
    return TinyConfig(
        vocab=shape.vocab, hidden=shape.hidden, layers=1, heads=shape.heads, kv_heads=shape.kv_heads, ffn=shape.ffn,
        **moe,
    )  # fmt: skip


def _full_shapes(cfg: TinyConfig) -> dict[str, tuple[int, ...]]:
    q, kv, h = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.hidden
    return {
        "embed": (cfg.vocab, h), "head": (cfg.vocab, h), "norm": (h,), "norm1": (h,), "norm2": (h,),
        "q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q), "gate": (cfg.ffn, h), "up": (cfg.ffn, h),
        "down": (h, cfg.ffn), "router": (cfg.experts, h), "expert_gate": (cfg.experts, cfg.expert_ffn, h),
        "expert_up": (cfg.experts, cfg.expert_ffn, h), "expert_down": (cfg.experts, h, cfg.expert_ffn),
    }  # fmt: skip


def shard_params(cfg: TinyConfig, kind: str, tp: int, device, dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """TP rank 0's parameters of one block at degree ``tp``, random (norm weights one), as leaves."""
    full = _full_shapes(cfg)
    out = {}
    for key in block_params(cfg, kind, 0 if kind == "layer" else -1):
        shape = list(full[key])
        idx = param_index(cfg, key, tp, 0)
        if idx is not None:
            shape[idx[0]] = len(idx[1])
        if key.startswith("norm"):
            t = torch.ones(shape, device=device, dtype=dtype)
        else:
            t = torch.randn(shape, device=device, dtype=dtype, generator=gen) * 0.02
        out[key] = t.requires_grad_(True)
    return out


def block_stage(shape: BlockShape, micro_batch: int, device, dtype, gen: torch.Generator) -> StageModel:
    """A ``StageModel`` holding one block of ``shape``, TP rank 0 of a stage of width ``shape.tp``,
    talking to ``LocalComm``. Built without ``StageModel.__init__``, which slices a whole reference
    model (a 128K-row vocabulary, every layer); the attributes set here are those its forward reads."""
    cfg, kind, tp, cp = tiny_config(shape), EXECUTOR_KIND[shape.kind], shape.tp, shape.cp
    spec = make_spec(cfg, [[tp, tp, tp]], [([tp], 1)], micro_batch, shape.seq_len * cp, cp=cp)
    stage = spec.replicas[0].stages[0]
    block = next(b for b in stage.blocks if b.kind == kind)
    model = StageModel.__new__(StageModel)
    model.spec, model.stage, model.comm, model.cfg = spec, stage, LocalComm(), cfg
    model.sp, model.context, model.sp_args = False, None, None
    model.experts, model.aux_values, model._aux_scale = None, [], 1.0
    if cfg.moe_layers:
        model.experts = ExpertPlace(cfg, model.comm, (0,), 0, (0,), shape.seq_len * cp)
    if cp > 1:  # the last chunk's queries against every chunk's keys, gathered by LocalComm
        bounds = contiguous(shape.seq_len * cp, cp)
        group = tuple(range(cp))
        model.context = (bounds[-1][0], lambda t: AllGatherSeq.apply(t, model.comm, group, bounds, cp - 1, "cp"))
    shards = layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, tp) if kind == "layer" else None
    params = shard_params(cfg, kind, tp, device, dtype, gen)
    model.blocks = [BlockState(block, 0, 0, stage.ranks, slice(None), shards, params)]
    return model


def block_inputs(model: StageModel, shape: BlockShape, micro_batch: int, device, dtype, gen: torch.Generator):
    """(input, targets) of one micro-batch: token ids for the embedding, else a residual stream
    that needs its gradient (a stage's input does, to pass it on)."""
    b, s = micro_batch, shape.seq_len
    targets = torch.randint(0, shape.vocab, (b, s), device=device, generator=gen)
    block: Block = model.blocks[0].block
    if block.kind == "embed":
        return torch.randint(0, shape.vocab, (b, s), device=device, generator=gen), targets
    x = torch.randn(b, s, shape.hidden, device=device, dtype=dtype, generator=gen).requires_grad_(True)
    return x, targets


def measure_blocks(
    requests: Iterable[BlockRequest],
    device: str | torch.device,
    dtype: str | torch.dtype,
    *,
    reps: int = 5,
    warmup: int = 1,
    threads_per_rank: int | None = None,
    seed: int = 0,
    tick: Callable[[str], None] | None = None,
) -> list[BlockTime]:
    """Median forward and backward seconds of each (shape, micro-batch) as the executor runs it
    on TP rank 0 of degree ``shape.tp``, communication excluded. Kinds in ``SKIPPED`` (none now)
    are left out. ``threads_per_rank``: torch's intra-op threads while measuring (None: as they are;
    the executor's ranks run with 1). ``tick(label)`` is called after each request."""
    device = torch.device(device)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    out = []
    with threads(threads_per_rank):
        for shape, micro_batch in requests:
            if shape.kind in SKIPPED:
                continue
            fwd_s, bwd_s = _measure_one(shape, micro_batch, device, dtype, reps, warmup, seed)
            out.append(BlockTime(shape=shape, micro_batch=micro_batch, fwd_s=fwd_s, bwd_s=bwd_s, samples=reps))
            if tick:
                tick(f"{shape.kind} tp{shape.tp} mb{micro_batch}")
    return out


def _measure_one(shape: BlockShape, micro_batch: int, device, dtype, reps: int, warmup: int, seed: int):
    """(forward, backward) median seconds of one block."""
    gen = torch.Generator(device=device).manual_seed(seed)
    model = block_stage(shape, micro_batch, device, dtype, gen)
    x, targets = block_inputs(model, shape, micro_batch, device, dtype, gen)

    def forward(_=None):
        return model.forward(x, targets, 1.0)

    fwd_s = median_time(forward, device, reps, warmup)
    probe = forward()
    grad = torch.randn(probe.shape, device=device, dtype=probe.dtype, generator=gen)
    del probe
    bwd_s = median_time(lambda y: y.backward(grad), device, reps, warmup, before=forward)
    return fwd_s, bwd_s


def block_flops(shape: BlockShape, micro_batch: int) -> float:
    """Forward FLOPs of one block on TP rank 0, for the time estimate that refuses a profile too
    slow for the device: 2 FLOPs per multiply-add of every GEMM, attention over the full s x s
    scores (an upper bound: causal kernels skip half), the LM head's logits and about 5 FLOPs per
    logit for the softmax and cross-entropy over the whole vocabulary."""
    t, h, tp = micro_batch * shape.seq_len, shape.hidden, shape.tp
    if shape.kind == "embedding":
        return float(t * h)
    if shape.kind == "head":
        return 2.0 * t * h * (-(-shape.vocab // tp)) + 5.0 * t * shape.vocab
    heads, kv = -(-shape.heads // tp), max(1, shape.kv_heads // tp)
    d = shape.head_dim
    ffn = -(-shape.ffn // tp) * max(1, shape.top_k)
    proj = 2 * t * h * d * (2 * heads + 2 * kv) + 2 * t * h * ffn * 3
    return float(proj + 4 * micro_batch * heads * shape.seq_len**2 * d)
