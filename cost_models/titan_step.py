"""torchtitan's runtime composed over the stages of a step: FSDP2's exposed gathers and
reduce-scatters (``dp_exposed_s``) and a stage's memory (``stage_memory``), from the terms of
``cost_models.titan``. ``cost_models.step`` calls these in place of Megatron's when
``Efficiency.runtime`` is 'torchtitan'. torchtitan shards with FSDP2 at every ZeRO level above 0
(its export writes ZeRO-1 and -2 as FSDP); ZeRO-0 is its replicated data parallelism, whose
bucketed all-reduce ``cost_models.step`` costs as Megatron's.
"""

from __future__ import annotations

from cost_models import titan
from cost_models.blocks import EMBED, HEAD, CostEnv
from cost_models.flops import padded_vocab
from cost_models.memory import in_flight_micro_batches
from cost_models.stage import RUNTIME_RESERVED_BYTES, StageCost, stage_runs

REDUCE_BYTES = 4.0  # FSDP2 mixed precision as torchtitan sets it: gradients reduce-scattered in fp32


def keeps_gathered(lay) -> bool:
    """Whether torchtitan, as ``ntp export --format torchtitan`` configures it, keeps each block's
    gathered parameters from its forward to its backward (``fsdp_reshard_after_forward =
    'never'``): torchtitan has no ZeRO-1 or -2, so the export runs them as FSDP that does not
    reshard, as it does ZeRO-3 without ``reshard_after_forward``. Costing them as resharding FSDP
    would price a run that regathers in backward and holds two blocks, while the exported one
    holds every block (a 70B stage of 17.6B parameters: 35 GB more).

    >>> from cost_models import ParallelLayout
    >>> lay = ParallelLayout(dp=8, global_batch=8, zero=1)
    >>> keeps_gathered(lay), keeps_gathered(lay.model_copy(update={"zero": 3}))
    (True, False)
    """
    return lay.zero in (1, 2) or not lay.reshard_after_forward


def dp_exposed_s(env: CostEnv, stages: list[StageCost]) -> float:
    """FSDP2 time on the step's critical path: the worst stage's. Without pipelining every
    micro-batch gathers and reduces each block (``titan.fsdp2_exposed_s``); with it torchtitan
    keeps the gathered parameters over the micro-batches and reduces once, after the last."""
    lay = env.layout
    passes = 1 if lay.pp > 1 else lay.num_micro_batches
    worst = 0.0
    for i in range(len(stages)):
        exposed = 0.0
        root = 0.0
        for block, t, n in stage_runs(env.model, lay, i):
            f, links = env.block_facts(block, t), env.degree(t).dp_links
            params = f.dense + f.expert
            if links.size <= 1 or params <= 0:
                continue
            gather = env.coll("all_gather", params * f.weight_bytes, links)
            reduce = env.coll("reduce_scatter", params * REDUCE_BYTES, links)
            if block in (EMBED, HEAD):  # the root unit: gathered before the first block, reduced after the last
                root += gather + reduce
                continue
            p = env.block_pass(block, t)
            fwd, bwd = titan.fsdp2_exposed_s(
                gather, reduce, p.fwd, p.bwd + p.recompute, n, not keeps_gathered(lay) and lay.pp == 1
            )
            exposed += fwd + bwd
        worst = max(worst, passes * (exposed + root))
    return worst


def stage_memory(env: CostEnv, stages: list[StageCost]) -> list[dict[str, float]]:
    """Peak bytes per GPU of each stage, by part, as torchtitan holds them."""
    return [_one_stage(env, i) for i in range(len(stages))]


def _one_stage(env: CostEnv, stage: int) -> dict[str, float]:
    lay, model, tr, settings = env.layout, env.model, env.training, env.titan
    held = in_flight_micro_batches(stage, lay.pp, lay.num_micro_batches, lay.vpp)
    sharded = largest = root = gathered = gathered_bytes = act = working = logits = 0.0
    for block, t, n in stage_runs(model, lay, stage):
        f, d = env.block_facts(block, t), env.degree(t)
        params = f.dense + f.expert
        sharded += n * params / (d.dp_links.size if lay.zero else 1)
        local_tokens = d.seqs * tr.seq_len / d.cp
        if block in (EMBED, HEAD):
            root += params
        else:
            largest = max(largest, params)
            gathered += n * params
            gathered_bytes += n * params * f.weight_bytes
            act += n * _layer_activation_bytes(env, block, t) * held
            cp_buffers = titan.ring_cp_buffer_bytes(local_tokens, model.num_heads * model.head_dim / t, d.cp)
            working = max(working, f.working + cp_buffers)
        if block == HEAD:
            per_entry = titan.loss_logit_bytes(t, settings.compile and settings.compile_loss)
            logits = local_tokens * (model.hidden_size * titan.ACT_BYTES + per_entry * padded_vocab(model, t) / t)
    gather_bytes = 1.0 if tr.dtype == "fp8" and settings.fsdp_float8_all_gather else 2.0
    if lay.zero == 0:  # replicated: nothing to gather
        buffers = 0.0
    elif lay.pp > 1:  # every block gathered, its gradient accumulated, whatever reshard_after_forward says:
        # the pipeline schedule sets reshard_after_backward and gradient sync off until the last micro-batch
        buffers = titan.pp_fsdp2_buffer_bytes(gathered_bytes + root * titan.ACT_BYTES, gathered + root)
    elif keeps_gathered(lay):
        buffers = titan.kept_fsdp2_buffer_bytes(gathered_bytes, largest, root)
    else:
        buffers = titan.fsdp2_buffer_bytes(largest, root, gather_bytes)
    parts = {
        "weights": sharded * 4.0,
        "grads": sharded * REDUCE_BYTES,
        "optimizer": sharded * 8.0,
        "fsdp_buffers": buffers,
        "activations": act + working + logits,
    }
    parts["allocator_reserve"] = titan.reserved_bytes(sum(parts.values()), settings.allocator_reserve_fraction)
    parts["runtime_reserved"] = RUNTIME_RESERVED_BYTES
    return parts


def _layer_activation_bytes(env: CostEnv, block, t: int) -> float:
    """Bytes one micro-batch leaves in one layer for backward under torchtitan's AC."""
    m, d, lay = env.model, env.degree(t), env.layout
    if lay.recompute == "full":
        return titan.full_ac_activation_bytes(d.tokens, m.hidden_size, t)
    if lay.recompute == "selective":
        q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
        saved = titan.op_sac_activation_bytes(d.tokens, m.hidden_size, q, kv, block.ffn or m.ffn_hidden_size, t)
        return saved + titan.op_sac_lse_bytes(d.tokens, m.num_heads, t)
    return env.block_facts(block, t).act
