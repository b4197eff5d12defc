"""What one pipeline stage costs: its blocks as runs of equal (block, degree), and the time per
micro-batch, memory and data-parallel traffic of those runs (``stage_cost``). ``cost_models.step``
composes the stages into a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cost_models.blocks import EMBED, EXECUTOR_TENSORS, HEAD, Block, CostEnv, Pass
from cost_models.data_parallel import DpTraffic, bucket_count
from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from cost_models.pipeline_layout import stage_chunk_spans

RUNTIME_RESERVED_BYTES = 2e9  # CUDA context, NCCL buffers, allocator slack


Run = tuple[Block, int, int]  # (block, degree, how many in a row)


def range_blocks(
    model: ModelSpec, layout: ParallelLayout, stage: int, start: int, count: int
) -> list[tuple[int, Block]]:
    """(block index, block) of layers start..start+count-1 on ``stage``, with the embedding
    when it is the first stage and the LM head when it is the last: index 0 = embedding,
    i + 1 = layer i, L + 1 = LM head."""
    L = model.num_layers
    blocks: list[tuple[int, Block]] = [(0, EMBED)] if stage == 0 else []
    blocks += [(i + 1, model.layer_kind(i)) for i in range(start, start + count)]
    return blocks + ([(L + 1, HEAD)] if stage == layout.pp - 1 else [])


def stage_blocks(model: ModelSpec, layout: ParallelLayout, stage: int) -> list[tuple[int, Block]]:
    """(block index, block) of every block ``stage`` runs for one micro-batch, chunk by chunk
    (``ParallelLayout.stage_chunks``): the embedding opens chunk 0, the LM head closes the last."""
    L, last = model.num_layers, layout.pp * layout.vpp - 1
    blocks: list[tuple[int, Block]] = []
    for chunk, start, count in layout.stage_chunks(stage, L):
        blocks += [(0, EMBED)] if chunk == 0 else []
        blocks += [(i + 1, model.layer_kind(i)) for i in range(start, start + count)]
        blocks += [(L + 1, HEAD)] if chunk == last else []
    return blocks


def stage_runs(model: ModelSpec, layout: ParallelLayout, stage: int) -> list[Run]:
    """The blocks of one stage as runs of equal (block, degree). A uniform layout's layers are
    grouped by kind without walking them (order is irrelevant when no degree changes)."""
    if layout.layer_tp is None:
        return list(_uniform_stage_runs(model, layout.tp, layout.pp, layout.vpp, layout.chunk_layers, stage))
    return runs_of(stage_blocks(model, layout, stage), layout.layer_tp)


@lru_cache(maxsize=4096)
def _uniform_stage_runs(
    model: ModelSpec, tp: int, pp: int, vpp: int, chunk_layers: tuple[int, ...] | None, stage: int
) -> tuple[Run, ...]:
    """``stage_runs`` of a uniform layout, memoised: a search asks for the same few stages of
    layouts that differ only in what the runs do not depend on (dp, micro-batch, ZeRO, ...)."""
    last = pp * vpp - 1
    runs: list[Run] = []
    for chunk, start, count in stage_chunk_spans(pp, vpp, chunk_layers, stage, model.num_layers):
        runs += [(EMBED, tp, 1)] if chunk == 0 else []
        runs += [(kind, tp, n) for kind, n in model.kind_counts(start, start + count).items()]
        runs += [(HEAD, tp, 1)] if chunk == last else []
    return tuple(runs)


def runs_of(blocks: list[tuple[int, Block]], degrees: tuple[int, ...]) -> list[Run]:
    """Consecutive blocks of equal kind and degree merged into runs."""
    runs: list[Run] = []
    for index, block in blocks:
        t = degrees[index]
        if runs and runs[-1][0] == block and runs[-1][1] == t:
            runs[-1] = (block, t, runs[-1][2] + 1)
        else:
            runs.append((block, t, 1))
    return runs


@dataclass
class StageCost:
    pass_: Pass  # per micro-batch, transitions included in fwd/bwd
    params: float  # per GPU
    state: dict[str, float]  # weights, grads, optimizer, low-precision weight bytes
    act_per_micro_batch: float  # activation bytes one in-flight micro-batch leaves behind
    act_fixed: float  # LM-head logits, the full-recompute and the ZeRO-3 working sets
    dp: DpTraffic  # gradient reduction and parameter gathering
    optimizer_params: float  # parameters this GPU's optimizer updates
    buffer_params: float  # parameters whose gradient buffer this GPU zeroes each step
    gemm_params: float  # low-precision GEMM weights recast once per step
    tensors: float = 0.0  # parameter tensors, as the executor holds them (``EXECUTOR_TENSORS``)

    def memory(self, held: float) -> dict[str, float]:
        """Bytes per GPU by part when ``held`` micro-batches are in flight."""
        act = self.act_per_micro_batch * held + self.act_fixed
        return {**self.state, "activations": act, "runtime_reserved": RUNTIME_RESERVED_BYTES}


def stage_cost(env: CostEnv, runs: list[Run]) -> StageCost:
    """Time per micro-batch, memory and DP traffic of one stage made of ``runs``."""
    lay, training = env.layout, env.training
    p = Pass()
    prev_t = None
    params = opt_params = buffer = gemm = reduce_s = gather_s = working = act = head = 0.0
    layers = tensors = 0
    state = {"weights": 0.0, "grads": 0.0, "optimizer": 0.0, "low_precision_weights": 0.0}
    largest_block = 0.0
    dp_group = lay.dp  # Megatron sizes buckets by the data-parallel group without cp
    for block, t, n in runs:
        p.add(env.block_pass(block, t), n)
        if prev_t is not None and prev_t != t:
            switch = env.transition_time(prev_t, t)
            p.fwd += switch / 2
            p.bwd += switch / 2
        prev_t = t
        layers += n if block not in (EMBED, HEAD) else 0
        tensors += n * EXECUTOR_TENSORS.get(block if block in (EMBED, HEAD) else "layer")
        f = env.block_facts(block, t)
        for k in state:
            state[k] += n * getattr(f.state, k)
        head = max(head, f.logits)  # the logits live once, not per micro-batch in flight
        act += n * f.act
        working = max(working, f.working)
        d = env.degree(t)
        dp_group = max(dp_group, lay.dp * d.copies)
        dense, expert = f.dense, f.expert
        if env.executor and lay.sequence_parallel and t > 1:  # norms saw only this rank's tokens: their
            # gradients are summed over the TP group, one all-reduce per norm (two per layer, the final norm)
            norms = n * {EMBED: 0, HEAD: 1}.get(block, 2)
            reduce_s += norms * env.coll("all_reduce", env.model.hidden_size * training.grad_bytes, d.tp_links)
        params += n * (dense + expert)
        largest_block = max(largest_block, dense + expert)
        gemm += n * f.gemm
        weight_bytes = f.weight_bytes
        for nparams, links in ((n * dense, d.dp_links), (n * expert, d.expert_dp_links)):
            if nparams <= 0:
                continue
            sharded = lay.zero >= 1 and links.size > 1
            opt_params += nparams / (links.size if lay.zero >= 1 else 1)
            buffer += nparams / (links.size if lay.zero >= 2 else 1)
            if sharded:
                reduce_s += env.coll("reduce_scatter", nparams * training.grad_bytes, links)
                gather_s += env.coll("all_gather", nparams * weight_bytes, links)
                if env.executor:  # one reduce-scatter and one all-gather per parameter tensor (executor.optimizer)
                    calls = n * EXECUTOR_TENSORS.get(block if block in (EMBED, HEAD) else "layer")
                    reduce_s += (calls - 1) * env.coll("reduce_scatter", 0.0, links)
                    gather_s += (calls - 1) * env.coll("all_gather", 0.0, links)
            elif env.executor:  # one all-reduce per parameter tensor, n blocks of them
                calls = n * EXECUTOR_TENSORS.get(block if block in (EMBED, HEAD) else "layer")
                reduce_s += env.coll("all_reduce", nparams * training.grad_bytes, links)
                reduce_s += (calls - 1) * env.coll("all_reduce", 0.0, links)
            else:
                reduce_s += env.coll("all_reduce", nparams * training.grad_bytes, links)
    if lay.zero >= 3:  # two layers' gathered weights live at once (double buffer), and one's gradients
        working = max(working, largest_block * (2 * training.param_bytes + training.grad_bytes))
        if not lay.reshard_after_forward:  # every layer's gathered weights stay from forward to backward
            working = max(working, params * training.param_bytes + largest_block * training.grad_bytes)
    buckets = bucket_count(params, dp_group, lay.zero, layers)
    return StageCost(
        pass_=p,
        params=params,
        state=state,
        act_per_micro_batch=act,
        act_fixed=head + working,
        dp=DpTraffic(reduce_s=reduce_s, gather_s=gather_s, buckets=buckets),
        optimizer_params=opt_params,
        buffer_params=buffer,
        gemm_params=gemm,
        tensors=tensors,
    )
