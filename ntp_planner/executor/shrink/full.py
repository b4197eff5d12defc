"""A one-GPU plan run as planned, unshrunk (`ntp validate --full-size`): the model's own width,
heads, FFN, vocabulary and every layer, at the plan's sequence length, micro-batch and
micro-batches per step.

Why only one GPU: a plan of several GPUs shrinks to fit this host's processes (``shrink.run``),
and a full-size model of several GPUs would not fit the one process that checks it. On one GPU
the run has no sharding left to check, but it still compares the executor's stage (the code
every TP degree runs) with the plain reference at the model's real shapes, and it times a real
training step: what `ntp validate --profile` then predicts is the plan's own step and memory
(``benchmarks/gpu_check.sh`` sets the prediction against ``torch.cuda.max_memory_allocated``).

The reference trains the whole batch at once beside the run, so both need memory: the run
holds weights, gradients and AdamW's two moments (``STATE_BYTES``), and on CPU the reference
holds as much again in the same host (``memory_check``). Torch only in ``device_memory_bytes``,
imported when it is called.
"""

from __future__ import annotations

from dataclasses import replace

from ntp_planner.executor.check.cuts import compare_cuts
from ntp_planner.executor.shrink.run import Shrunk, block_style
from ntp_planner.executor.spec import TinyConfig, make_spec
from ntp_planner.plan import Plan
from topologies.errors import InputError

# bytes per parameter of the run's dtype: weights, gradients, AdamW's two moments; bf16 keeps a bf16
# copy beside fp32 masters, gradients and moments (``zero.MASTER_DTYPE``)
STATE_BYTES = {"float64": 4 * 8, "float32": 4 * 4, "bfloat16": 2 + 3 * 4 + 4}


def full_size(plan: Plan, steps: int = 3, seed: int = 0) -> Shrunk:
    """The run of a one-GPU ``plan`` at its real size; InputError in one sentence for a plan
    that is not one GPU, or whose blocks the executor cannot run unshrunk."""
    lay, model = plan.layout, plan.model
    if lay.world_size != 1:
        raise InputError(
            f"--full-size runs a one-GPU plan unshrunk, but this plan's layout is tp({lay.tp}) x pp({lay.pp}) x "
            f"cp({lay.cp}) x dp({lay.dp}) = {lay.world_size} GPUs; drop --full-size to run it shrunk"
        )
    if model.num_experts:
        raise InputError(
            f"--full-size runs dense models; {model.name} has {model.num_experts} experts: drop --full-size"
        )
    if model.hidden_size != model.num_heads * model.head_dim:
        raise InputError(
            f"the executor's layer needs hidden = heads * head_dim, but {model.name} has {model.num_heads} * "
            f"{model.head_dim} = {model.num_heads * model.head_dim} != {model.hidden_size}; drop --full-size"
        )
    seq_len = plan.training.seq_len
    cfg = TinyConfig(
        vocab=model.vocab_size, hidden=model.hidden_size, layers=model.num_layers, heads=model.num_heads,
        kv_heads=model.num_kv_heads, ffn=model.ffn_hidden_size,
        **block_style(model), max_positions=max(seq_len, model.max_position_embeddings),
    )  # fmt: skip
    micro = lay.num_micro_batches
    note = (
        f"full size: {model.name} unshrunk ({model.num_layers} layers, hidden {model.hidden_size}, "
        f"{model.num_heads} heads, {model.num_kv_heads} KV heads, FFN {model.ffn_hidden_size}, vocabulary "
        f"{model.vocab_size}, {_count(model.num_params)} parameters), sequence {seq_len} tokens, "
        f"{micro} micro-batches of {lay.micro_batch} per step, as planned"
    )
    skipped = ["tied input and output embeddings (run as two matrices)"] if model.tie_embeddings else []
    skipped += [f"dropout {model.dropout:g} (off: the check is deterministic)"] if model.dropout else []
    notes = [note] + (["not executed: " + "; ".join(skipped)] if skipped else [])
    spec = make_spec(
        cfg, [[1] * (model.num_layers + 2)], [([1], micro)], lay.micro_batch, seq_len, width=1, steps=steps,
        seed=seed, recompute=lay.recompute, notes=tuple(notes),
    )  # fmt: skip
    return Shrunk(spec, ((0, plan.placement[0]),), (0,), ((0,),))


def memory_check(plan: Plan, backend: str, dtype: str, device_bytes: float) -> None:
    """InputError when the run's training state alone (``STATE_BYTES`` per parameter of
    ``dtype``; activations come on top) exceeds the memory it runs in: ``device_bytes`` of one
    GPU (nccl), or of the host (gloo), which also holds the reference's copy of the state."""
    params = plan.model.num_params + (plan.model.embedding_params if plan.model.tie_embeddings else 0)
    copies, per = (1 if backend == "nccl" else 2), STATE_BYTES[dtype]
    need = copies * per * params
    if need > device_bytes:
        where = "one GPU's" if backend == "nccl" else "this host's"
        raise InputError(
            f"--full-size in {dtype} needs about {copies} x {per} bytes x {params / 1e9:.2f}B parameters = "
            f"{need / 2**30:.1f} GiB of training state, more than {where} {device_bytes / 2**30:.1f} GiB; "
            "choose a smaller model, a narrower --dtype or drop --full-size"
        )


def full_run(plan: Plan, nproc: int, backend: str, steps: int, seed: int, dtype: str, memory_bytes: float):
    """(the full-size run in ``dtype``, its shard cuts against the planner's), for ``ntp validate
    --full-size`` on ``nproc`` processes (one) with ``memory_bytes`` to hold it."""
    if nproc != 1:
        raise InputError(f"--full-size runs the one-GPU plan on one process, not {nproc}; drop --nproc or torchrun")
    shrunk = full_size(plan, steps, seed)
    memory_check(plan, backend, dtype, memory_bytes)
    shrunk = replace(shrunk, spec=replace(shrunk.spec, dtype=dtype))
    return shrunk, compare_cuts(shrunk.spec, plan.model)


def _count(n: int) -> str:
    """'1.10B', '121.2K': a parameter count in the unit that shows it.

    >>> _count(1_100_048_384), _count(6_738_415_616), _count(121_152)
    ('1.10B', '6.74B', '121.2K')
    """
    for unit, size in (("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n / 1e3:.1f}K"


def device_memory_bytes(backend: str) -> float:
    """Memory the run computes in: the first GPU's (nccl), or this host's (gloo)."""
    if backend == "nccl":
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory)
    import os

    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
