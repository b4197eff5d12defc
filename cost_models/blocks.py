"""The cost of one block (embedding, transformer layer, LM head) at one TP degree, for one
micro-batch on one GPU: compute, recompute, TP/CP/EP communication, memory and DP traffic.

A block at degree t inside a stage of ``layout.tp`` GPUs runs tp/t data-parallel copies, each on
its share of the micro-batch (``Degree``). ``CostEnv`` caches what the per-layer solver and the
step estimator ask repeatedly; ``cost_models.step`` composes blocks into stages and a step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

from cost_models import collectives as coll
from cost_models import moe, titan
from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.flops import (
    ACT_BYTES,
    Op,
    embedding_ops,
    gemm,
    head_ops,
    kv_heads_per_rank,
    layer_ops,
    moe_ops,
    unfused_rotary,
)
from cost_models.layout import ParallelLayout, sub_batch
from cost_models.memory import (
    StateBytes,
    activation_bytes_per_layer,
    embedding_params_per_gpu,
    head_activation_bytes,
    head_params_per_gpu,
    layer_params_per_gpu,
    low_precision_copy_bytes,
    mtp_activation_bytes,
    mtp_params_per_gpu,
    saved_input_bytes,
    state_bytes,
)
from cost_models.model import LayerKind, ModelSpec
from cost_models.profile import BlockShape
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster, GroupLinks

EMBED, HEAD = "embedding", "head"
Block = LayerKind | str  # a layer kind, or EMBED / HEAD

ANALYTIC = {
    "all_reduce": coll.all_reduce_time,
    "all_gather": coll.all_gather_time,
    "reduce_scatter": coll.reduce_scatter_time,
    "all_to_all": coll.all_to_all_time,
    "send_recv": coll.send_recv_time,
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}  # a profile's torch dtype
# parameter tensors the executor all-reduces one at a time (Llama-style blocks): the embedding;
# two norms, q, k, v, o, gate, up, down; the final norm and the LM head
RECOMPUTED_OPS = {  # ParallelLayout.recompute_modules -> the ops each runs forward again in backward
    "mla_up_proj": ("q-up", "kv-up", "rotary"),  # MLASelfAttention's qkv_up_checkpoint
    "mlp": ("mlp-up", "mlp-act", "mlp-down"),  # dense layers only (TransformerLayer.recompute_mlp)
    "moe_act": ("experts-act",),  # TEGroupedMLP's activation checkpoint
    "layernorm": ("norms",),  # the input and pre-MLP norms
}
EXECUTOR_TENSORS = {EMBED: 1, HEAD: 2, "layer": 9}


@dataclass
class Pass:
    """Seconds of one micro-batch through some blocks on one GPU, by category."""

    fwd: float = 0.0
    bwd: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0  # MoE dispatch and combine on the critical path in the steady state
    hw_flops: float = 0.0
    ep_comm_full: float = 0.0  # ... all of it (not in total: what an unpaired micro-batch pays)

    def add(self, other: Pass, times: float = 1.0) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + times * getattr(other, f.name))

    @property
    def total(self) -> float:
        return self.fwd + self.bwd + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm


@dataclass(frozen=True)
class Degree:
    """What running a block at TP degree ``t`` inside a stage means: its share of the
    micro-batch and the groups it talks to (rank order tp < cp < dp < pp; a degree-t group's
    in-stage copies sit at stride t inside the stage's tp GPUs)."""

    t: int
    seqs: int  # sequences per TP group
    cp: int  # sequence split: inside the stage times the layout's cp
    tokens: int  # tokens one GPU's TP group processes
    copies: int  # data-parallel copies of the block inside the stage (tp / t)
    tp_links: GroupLinks
    cp_links: GroupLinks
    ep_links: GroupLinks
    dp_links: GroupLinks  # every rank holding the same shard: in-stage copies x dp x cp
    expert_dp_links: GroupLinks
    etp: int  # expert tensor parallelism: t, or the layout's etp when it folds the experts
    experts: moe.ExpertLinks

    @property
    def dp_ranks(self) -> int:
        return self.dp_links.size


class CostEnv:
    """Everything the estimator looks up repeatedly for one (model, training, layout, cluster),
    with per-degree and per-block caches. Also used by the per-layer solver to cost blocks."""

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        layout: ParallelLayout,
        cluster: Cluster,
        eff: Efficiency = DEFAULT_EFFICIENCY,
        pass_cache: dict | None = None,
    ):
        """``pass_cache`` may be shared between layouts with the same ``pass_cache_key``."""
        self.model, self.training, self.layout, self.cluster, self.eff = model, training, layout, cluster, eff
        gpu = cluster.gpu
        self.arch = gpu.architecture
        self.peak = gpu.peak_flops_per_s(training.dtype)  # the GEMM format's peak
        self.bf16_peak = gpu.peak_flops_per_s("bf16")
        self.mem_bw = gpu.hbm_bw_bytes_per_s * eff.hbm_efficiency
        high = "fp16" if training.dtype == "fp16" else "bf16"
        self._gemm = {  # low_precision flag -> (FLOP/s of a large GEMM, half dimension)
            flag: (
                gpu.peak_flops_per_s(fmt)
                * eff.gemm_peak_fraction(self.arch, fmt)
                * eff.power_headroom(gpu.tdp_watts, gpu.peak_basis_watts, fmt),
                eff.half_dim(gpu.peak_flops_per_s(fmt) / gpu.sm_count),
            )
            for flag, fmt in ((True, training.dtype), (False, high))
        }
        fp8_attention = 2.0 if training.fp8_attention else 1.0  # cuDNN's fp8 attention: its GEMMs at twice the rate
        self._attention = eff.attention_fraction(
            self.arch, training.attention_kernel, gpu.name, model.head_dim, fp8_attention
        )
        self.lp_copy_bytes = low_precision_copy_bytes(training.dtype, self.arch, training.fp8_params)
        self.stage_tokens = layout.micro_batch * training.seq_len // layout.cp
        self.executor = eff.runtime == "executor"
        self.titan = eff.titan if eff.runtime == "torchtitan" else None  # torchtitan's costs (cost_models.titan)
        self.memory_scale = 1.0  # memory-bound passes: uncompiled torchtitan runs them as kernel chains
        if self.titan is not None:
            self.memory_scale = 1.0 if self.titan.compile else self.titan.eager_memory_factor
            self._attention *= self.titan.attention_factor
            if training.dtype == "fp8" and self.titan.float8_scaling == "rowwise":
                rate, half = self._gemm[True]
                self._gemm[True] = (rate * self.titan.rowwise_gemm_fraction, half)
        self.profile = eff.profile
        self.notes: set[str] = set()  # where a profile did not cover what was costed
        self.act_bytes = ACT_BYTES  # bytes of one activation on the wire
        self.compute_scale = self.comm_scale = 1.0
        self.host_slowdown = 1.0  # how much slower a CPU rank computes beside its computing neighbours
        if self.profile is not None:
            self.profile.check_gpu(gpu.name)
            self.act_bytes = DTYPE_BYTES[self.profile.dtype]
            cal, device = self.profile.calibration, self.profile.device
            # a CPU's cores are shared by every rank: with more ranks than cores each computes slower
            # (time-sharing: each of more ranks than cores gets cores / ranks of one; a synthetic
            # concurrency test here measured 1.6x for 2 ranks on 2 hyperthreads where the executor's
            # small kernels lose 5-10%, so the plain share is kept)
            ranks = eff.host_ranks or min(cluster.num_gpus, cluster.spec.gpus_per_node)
            share = max(1.0, ranks / device.cores) if device.kind == "cpu" else 1.0
            self.host_slowdown = share
            self.compute_scale, self.comm_scale = cal.compute_scale * share, cal.comm_scale
        self._degrees: dict[int, Degree] = {}
        self._state: dict[tuple[Block, int], tuple[StateBytes, float]] = {}
        self._facts: dict[tuple[Block, int], BlockFacts] = {}
        self._passes: dict[tuple[Block, int], Pass] = {} if pass_cache is None else pass_cache

    # ---- degrees and groups ------------------------------------------------------------------
    def degree(self, t: int) -> Degree:
        if t not in self._degrees:
            lay, c = self.layout, self.cluster
            seqs, split = sub_batch(lay.micro_batch, t, lay.tp)
            copies = lay.tp // t
            cp_stride = lay.rank_grid.stride("cp")  # the rank order's, like every stride below
            etp = lay.expert_tp if lay.folded else t
            if lay.folded:  # the experts' own grid (etp fastest, then ep, then edp): rank 0's groups
                grid = lay.rank_grid
                ep_links = c.group_links(grid.expert_group("ep", 0, lay.ep, etp))
                expert_dp_links = c.group_links(grid.expert_group("edp", 0, lay.ep, etp))
            else:
                ep_links = c.strided_links(0, cp_stride, lay.ep)
                expert_dp_links = c.grid_links(t, copies, cp_stride * lay.ep, lay.dp * lay.cp // lay.ep)
            self._degrees[t] = Degree(
                t=t,
                seqs=seqs,
                cp=split * lay.cp,
                tokens=seqs * self.training.seq_len // (split * lay.cp),
                copies=copies,
                tp_links=c.strided_links(0, 1, t),
                cp_links=c.grid_links(t, split, cp_stride, lay.cp),
                # Megatron generates expert groups over the flattened cp x dp ranks ("tp-cp-ep-dp-pp"):
                # EP takes consecutive ones, the expert data-parallel group the rest
                ep_links=ep_links,
                dp_links=c.grid_links(t, copies, cp_stride, lay.cp * lay.dp),
                expert_dp_links=expert_dp_links,
                etp=etp,
                experts=moe.ExpertLinks(
                    ep=ep_links,
                    etp=c.strided_links(0, 1, etp),
                    tp_ep=c.strided_links(0, 1, etp * lay.ep) if lay.folded or t == lay.tp else ep_links,
                ),
            )
        return self._degrees[t]

    # ---- collectives ---------------------------------------------------------------------------
    def coll(self, op: str, nbytes: float, links: GroupLinks) -> float:
        """Seconds of one collective ``op`` (``ANALYTIC``'s names) of ``nbytes`` over ``links``:
        the profile's measured fit where it covers a group of that size inside one domain, else
        the analytical alpha-beta term (``cost_models.collectives``)."""
        if self.profile is not None and links.size > 1:
            measured = self.profile.collective_time(op, links.size, nbytes) if links.domains <= 1 else None
            if measured is not None:
                return measured * self.comm_scale
            where = f"spans {links.domains} NVLink domains" if links.domains > 1 else "was not profiled"
            self.notes.add(f"{op} on {links.size} ranks {where}: analytical time")
        return ANALYTIC[op](nbytes, links, self.eff)

    # ---- time of one micro-batch through one block -------------------------------------------
    def op_time(self, op: Op) -> float:
        """Seconds of one execution of ``op`` (its forward unit), launch overhead excluded."""
        if op.kind == "gemm":
            rate, half = self._gemm[op.low_precision and self.training.low_precision]
            flops = op.flops * self._tile_factor(op)  # whole output tiles
            if op.name.startswith(moe.GROUPED):
                flops *= self._expert_waves(op)
                return flops / (rate * moe.grouped_gemm_factor(self.eff, op.m, op.n, op.k, half))
            return flops / (rate * self.eff.shape_factor(op.m, op.n, op.k, half))
        if op.kind == "flash":  # attention runs in bf16 whatever the GEMM format
            return op.flops / (self.bf16_peak * self._attention)
        return op.mem_bytes / self.mem_bw * self.memory_scale

    def _tile_factor(self, op: Op) -> float:
        """``Efficiency.tile_factor`` of a weight GEMM. The unfused attention's score and value GEMMs
        are left out: their ``k`` / ``n`` is a head dimension (128, 192) that cuBLAS covers with a
        tile as narrow, not a weight width (padded, a 192-wide head made them 1.22x slower on Hopper)."""
        if op.name.startswith("attention"):
            return 1.0
        return self.eff.tile_factor(self.arch, op.n, op.k)

    def _expert_waves(self, op: Op) -> float:
        """``moe.expert_waves`` of one expert GEMM of ``op`` (``op.batch`` local experts) on this GPU;
        torchtitan's experts are one ``torch._grouped_mm`` over every local expert, as under a graph."""
        tile = self.eff.gemm_tile.get(self.arch)
        if tile is None:
            return 1.0
        one_kernel = self.training.cuda_graphs or self.titan is not None
        concurrent = moe.expert_concurrency(op.batch, self.eff.expert_gemm_streams, one_kernel)
        return moe.expert_waves(op.m, op.n, op.k, concurrent, tile, self.cluster.gpu.sm_count)

    def ops_pass(self, ops: list[Op]) -> Pass:
        """Forward and backward of ``ops``: each op's cost times its fwd / bwd multiplicity, plus
        one kernel overhead per launch (the multiplicities count launches too)."""
        k = self.eff.kernel_overhead_s
        fwd = bwd = flops = 0.0
        for op in ops:
            t = self.op_time(op)
            fwd += op.fwd * (t + k)
            bwd += op.bwd * (t + k)
            flops += (op.fwd + op.bwd) * op.flops
        return Pass(fwd=fwd, bwd=bwd, hw_flops=flops)

    def profile_shape(self, block: Block, t: int) -> BlockShape:
        """How a profile names ``block`` at degree ``t`` in this model and sequence."""
        m = self.model
        moe = block not in (EMBED, HEAD) and block.moe
        kind = block if block in (EMBED, HEAD) else ("moe_layer" if moe else "layer")
        ffn = m.moe_ffn_hidden_size if moe else (block.ffn if block not in (EMBED, HEAD) else m.ffn_hidden_size)
        return BlockShape(
            kind=kind,
            hidden=m.hidden_size,
            heads=m.num_heads,
            kv_heads=m.num_kv_heads,
            head_dim=m.head_dim,
            ffn=ffn or m.ffn_hidden_size,
            vocab=m.vocab_size,
            experts=m.num_experts if moe else 0,
            top_k=m.moe_top_k if moe else 0,
            tp=t,
            seq_len=self.training.seq_len // self.degree(t).cp,
            cp=self.degree(t).cp,
        )

    def compute_pass(self, block: Block, t: int, ops: list[Op]) -> Pass:
        """Forward and backward compute of one block: the profile's measurement of it (at the
        micro-batch size, interpolated between measured sizes and extrapolated linearly beyond
        them) where it has the block's shape, else ``ops_pass`` of its operations."""
        p = self.ops_pass(ops)
        if self.profile is None:
            return p
        shape, seqs = self.profile_shape(block, t), self.degree(t).seqs
        got = self.profile.block_time(shape, seqs)
        what = f"{shape.kind} at tp {t} ({seqs} x {shape.seq_len} tokens)"
        if got is None:
            got = self.profile.block_time(shape, seqs, extrapolate=True)
            if got is None:
                self.notes.add(f"{what} was not profiled: analytical compute")
                return p
            self.notes.add(f"{what} extrapolated from the profile's micro-batch sizes")
        p.fwd, p.bwd = got[0] * self.compute_scale, got[1] * self.compute_scale
        return p

    def block_pass(self, block: Block, t: int) -> Pass:
        """One micro-batch through ``block`` at degree ``t`` (cached, perhaps shared with other
        layouts; the profile notes its computation left are kept beside it and re-noted on a hit)."""
        key = (block, t)
        if key not in self._passes:
            outer, self.notes = self.notes, set()
            if block == EMBED:
                self._passes[key] = self._embed_pass(t)
            elif block == HEAD:
                self._passes[key] = self._head_pass(t)
            else:
                self._passes[key] = self._layer_pass(block, t)
            self._passes["notes", key], self.notes = frozenset(self.notes), outer
        self.notes |= self._passes.get(("notes", key), frozenset())
        return self._passes[key]

    def _collective(self, d: Degree, nbytes_per_token: float) -> float:
        """One TP all-reduce (or reduce-scatter + all-gather under sequence parallelism: the same
        bytes) of ``nbytes_per_token`` per token of the block's activation."""
        return self.coll("all_reduce", nbytes_per_token * d.tokens * self.model.hidden_size, d.tp_links)

    def _tp_exposed(self, coll_s: float, overlappable_s: float, gemm_s: float) -> float:
        """TP communication left on the critical path. With userbuffers overlap
        (``tp_comm_overlap``) every collective is pipelined with the GEMM it feeds: a share
        ``tp_overlap_hidden`` hides, never more than the GEMM time. Without it Megatron still
        overlaps ``overlappable_s`` of it (backward collectives launched asynchronously beside
        the weight- or input-gradient GEMM), up to that GEMM time."""
        if self.executor:  # synchronous collectives: nothing hides
            return coll_s
        if self.layout.tp_comm_overlap:
            return max((1 - self.eff.tp_overlap_hidden) * coll_s, coll_s - gemm_s)
        return coll_s - overlappable_s + max(0.0, overlappable_s - gemm_s)

    def _embed_pass(self, t: int) -> Pass:
        """Vocabulary-parallel lookup; its partial outputs are summed over TP (forward only)."""
        d = self.degree(t)
        ops = embedding_ops(self.model, d.seqs, self.training.seq_len, d.cp, t, self.training.grad_bytes)
        p = self.compute_pass(EMBED, t, ops)
        p.tp_comm = self._collective(d, self.act_bytes) * (1 - self.eff.tp_overlap_hidden * self.layout.tp_comm_overlap)
        if self.executor and self.layout.sequence_parallel:  # reduce-scattered forward, gathered backward
            p.tp_comm = sum(self._executor_sp(d))
        return p

    def _executor_sp(self, d: Degree) -> tuple[float, float]:
        """(all-gather, reduce-scatter) of one activation over the TP group, each its own call."""
        nbytes = self.act_bytes * d.tokens * self.model.hidden_size
        return self.coll("all_gather", nbytes, d.tp_links), self.coll("reduce_scatter", nbytes, d.tp_links)

    def _head_pass(self, t: int) -> Pass:
        """The output layer and loss (``_output_pass``) and, after them on the last stage, the
        model's multi-token prediction modules (``_mtp_module_pass``, DeepSeek-V3)."""
        p = self._output_pass(t)
        if self.model.mtp_layers:
            p.add(self._mtp_module_pass(t), self.model.mtp_layers)
        return p

    def _mtp_module_pass(self, t: int) -> Pass:
        """One multi-token prediction module (``flops.mtp_ops``: Megatron-Core's
        ``MultiTokenPredictionBlock``): the shared embedding looked up again, two RMSNorms and the
        2h -> h projection, one transformer layer with its collectives (the MTP layer's kind), and
        its own pass through the shared output layer and loss."""
        m, tr, d = self.model, self.training, self.degree(t)
        h = m.hidden_size
        extra = [
            Op("mtp-norms", "memory", mem_bytes=2 * 2 * ACT_BYTES * d.tokens * h),
            gemm("mtp-proj", d.tokens, h // t, 2 * h),
        ]
        p = self.ops_pass(extra + embedding_ops(m, d.seqs, tr.seq_len, d.cp, t, tr.grad_bytes))
        p.add(self.block_pass(m.mtp_layer_kind, t))
        p.add(self._output_pass(t))
        return p

    def _output_pass(self, t: int) -> Pass:
        """Final norm, column-parallel logits and vocabulary-parallel cross entropy; one TP
        collective's worth of traffic (gather forward, reduce backward)."""
        d = self.degree(t)
        tr = self.training
        ops = head_ops(self.model, d.seqs, tr.seq_len, t, d.cp, tr.grad_bytes, tr.fused_cross_entropy)
        p = self.compute_pass(HEAD, t, ops)
        if self.executor:  # the whole logits gathered forward; the normed input's gradient summed backward
            act = self.act_bytes * d.tokens
            logits = self.coll("all_gather", act * self.model.vocab_size, d.tp_links)
            if self.layout.sequence_parallel:  # the input all-gathered forward, reduce-scattered backward
                p.tp_comm = logits + sum(self._executor_sp(d))
            else:
                p.tp_comm = logits + self.coll("all_reduce", act * self.model.hidden_size, d.tp_links)
            return p
        p.tp_comm = self._collective(d, self.act_bytes) * (1 - self.eff.tp_overlap_hidden * self.layout.tp_comm_overlap)
        return p

    def _layer_pass(self, kind: LayerKind, t: int) -> Pass:
        """One transformer layer: compute, recompute and collectives."""
        m, lay, tr, d = self.model, self.layout, self.training, self.degree(t)
        ops = layer_ops(
            m,
            kind,
            d.seqs,
            tr.seq_len,
            t,
            d.cp,
            lay.ep,
            lay.sequence_parallel,
            tr.flash_attention,
            tr.dtype,
            self.arch,
            tr.fp8_recipe,
            tr.grad_bytes,
        )
        if not tr.rope_fusion:  # Megatron-Core's unfused rotation (YaRN: GPT-OSS)
            ops = [unfused_rotary(op) if op.name == "rotary" else op for op in ops]
        if kind.moe:
            ops = self._moe_layer_ops(ops, d)
        p = self.compute_pass(kind, t, ops)
        if kind.moe and not self.executor:  # the experts' host costs (Efficiency.moe_host_sync_s, ...)
            p.fwd += self._moe_host_s(d, p.fwd + p.bwd)
        tp_fwd, tp_bwd = self._tp_layer_comm(kind, d, ops)
        p.tp_comm = tp_fwd + tp_bwd
        core = [op for op in ops if op.name.startswith(("attention", "softmax"))]
        cp_fwd, cp_bwd = self._titan_cp(kind, d, core) if self.titan else self._cp_comm(kind, d, core)
        p.cp_comm = cp_fwd + cp_bwd
        if kind.moe and lay.ep * d.etp > 1:  # dispatch + combine, forward and backward
            one = self._dispatch_s(d)
            p.ep_comm_full = 4 * one
            overlap = "none" if self.executor else lay.moe_overlap
            p.ep_comm = moe.exposed_dispatch(overlap, 2 * one, 2 * one, p.fwd, p.bwd)
        if lay.recompute == "full":  # the forward again, with its collectives: of the four
            # all-to-alls in ep_comm, the forward's two (dispatch and combine) are half
            p.recompute = p.fwd + tp_fwd + cp_fwd + p.ep_comm / 2
            p.hw_flops += sum(op.flops for op in ops)
        elif lay.recompute == "selective" and self.titan:  # per-op SAC (cost_models.titan)
            kv_share = kv_heads_per_rank(m, t) / (m.num_heads / t + 2 * kv_heads_per_rank(m, t))
            fwd_s = {op.name: op.fwd * (self.op_time(op) + self.eff.kernel_overhead_s) for op in ops}
            p.recompute = titan.op_sac_recompute_s(fwd_s, kv_share)
        elif lay.recompute == "selective":
            p.recompute = sum(op.fwd * (self.op_time(op) + self.eff.kernel_overhead_s) for op in core)
            p.hw_flops += sum(op.flops for op in core)
        if lay.recompute_modules and lay.recompute != "full":
            again = {name for module in lay.recompute_modules for name in RECOMPUTED_OPS[module]}
            redo = [op for op in ops if op.name in again]
            p.recompute += sum(op.fwd * (self.op_time(op) + self.eff.kernel_overhead_s) for op in redo)
            p.hw_flops += sum(op.fwd * op.flops for op in redo)
        return p

    def moe_shape(self, d: Degree) -> moe.MoeShape:
        """The MoE sublayer of one GPU at degree ``d``, at the busiest EP rank's load."""
        m = self.model
        mean = moe.MoeShape(
            d.tokens // d.t, m.hidden_size, m.num_experts, m.moe_top_k, m.moe_ffn_hidden_size, self.layout.ep, d.etp
        )
        imbalance = moe.imbalance_factor(mean.ep, mean.experts_per_rank, mean.rows_per_expert, self.eff.moe_load_cv)
        tr = self.training
        load = moe.routed_load(imbalance, tr.moe_capacity_factor, tr.moe_pad_to_capacity)
        return moe.MoeShape(**{**mean.__dict__, "load": load})

    def _moe_layer_ops(self, ops: list[Op], d: Degree) -> list[Op]:
        """``layer_ops``' MoE sublayer at the expert grid and the busiest rank's load: its router,
        experts and shared expert replaced by ``moe_ops`` of them, and the weight-gradient
        accumulation recounted over the new GEMMs (``layer_ops``: 2 x grad_bytes per weight)."""
        m, s = self.model, self.moe_shape(d)
        old = {op.name for op in moe_ops(m, d.tokens, d.t, self.layout.ep)} | {"main-grad-accumulate"}
        flex = self.layout.moe_dispatcher == "flex"
        probs = 4 if flex else 2  # DeepEP / HybridEP take fp32 probabilities
        new = moe_ops(m, d.tokens, d.t, self.layout.ep, s.etp, s.load, probs_bytes=probs)
        spec = self.cluster.spec
        backend = moe.flex_backend_of(self.training.moe_flex_backend, spec.domain_size, spec.gpus_per_node)
        if flex and backend == "hybridep":  # permuted inside dispatch and combine
            new = [op for op in new if op.name not in moe.FUSED_BY_HYBRIDEP]
        if self.training.cuda_graphs:  # graphed: TE's fused grouped MLP adds fc2's bias (expert_bias_bytes)
            new = [op for op in new if op.name != "experts-bias"]
        kept = [op for op in ops if op.name not in old] + new
        gemms = [op for op in kept if op.kind == "gemm" and not op.name.startswith("attention")]
        weights = sum(op.n * op.k * op.batch for op in gemms)
        grad = self.training.grad_bytes
        return kept + [Op("main-grad-accumulate", "memory", mem_bytes=2 * grad * weights, fwd=0.0, bwd=1.0)]

    def _moe_host_s(self, d: Degree, gpu_s: float) -> float:
        """Host time an MoE layer's GPU waits for per micro-batch: the host sync
        (``_host_sync_s``), the experts' GEMMs launched one at a time
        (``moe.grouped_gemm_launch_s``) and, under the combined 1F1B overlap, the host work of
        the layer pair beyond ``gpu_s`` and the other two (``moe.overlap_host_floor_s``)."""
        tr, eff = self.training, self.eff
        waits = self._host_sync_s(d)
        waits += moe.grouped_gemm_launch_s(
            self.moe_shape(d).experts_per_rank, eff.grouped_gemm_launch_s, tr.cuda_graphs
        )
        floor = moe.overlap_host_floor_s(self.layout.moe_overlap, tr.cuda_graphs, eff.moe_overlap_host_s, gpu_s + waits)
        return waits + floor

    def _host_sync_s(self, d: Degree) -> float:
        """The MoE layer's host stall per micro-batch (``Efficiency.moe_host_sync_s``): the
        dispatcher's, ``flex_scaleout`` for flex when its group spans NVLink domains, or, if longer,
        the attention backend's re-selection on layers whose attention differs from the previous
        layer's (``Efficiency.moe_attention_reselect_s``, ``moe.attention_switch_fraction``)."""
        dispatcher = self.layout.moe_dispatcher
        if self.training.moe_pad_to_capacity or self.training.cuda_graphs:  # counts known ahead / no host in a graph
            return 0.0
        if dispatcher == "flex" and d.experts.tp_ep.domains > 1:
            dispatcher = "flex_scaleout"
        reselect = self.eff.moe_attention_reselect_s * moe.attention_switch_fraction(self.model)
        return max(self.eff.moe_host_sync_s.get(dispatcher, 0.0), reselect)

    def _dispatch_s(self, d: Degree) -> float:
        """Seconds of one dispatch (combine costs the same) of the layout's dispatcher
        (``moe.dispatch_bytes``)."""
        s = self.moe_shape(d)
        nbytes = moe.dispatch_bytes(self.layout.moe_dispatcher, s, d.experts.tp_ep.domains, self.act_bytes)
        return moe.dispatch_time(nbytes, d.experts, self.coll, self.eff)

    def _tp_layer_comm(self, kind: LayerKind, d: Degree, ops: list[Op]) -> tuple[float, float]:
        """Exposed TP communication of one layer, forward and backward.

        Per sublayer (attention, MLP), Megatron-style TP moves the activation four times:
        forward all-gathers the input and reduce-scatters the output (one all-reduce without
        sequence parallelism); backward all-gathers the output gradient, reduce-scatters the
        input gradient beside the weight-gradient GEMM and, under sequence parallelism,
        all-gathers the input again for that GEMM beside the input-gradient GEMM (Korthikanti et
        al. 2022, section 4.2.2). Low-precision training gathers the forward input in fp8.
        """
        if d.t == 1:
            return 0.0, 0.0
        # an MoE sublayer's routed experts talk over their expert groups (``_dispatch_s``); its shared
        # expert, a TP MLP, has the TP collectives of one
        mlp = bool(self.model.moe_shared_ffn_hidden_size) if kind.moe else kind.ffn > 0
        sublayers = kind.attention + mlp
        half = self._collective(d, self.act_bytes) / 2  # one all-gather or reduce-scatter
        gather_in = half * (0.5 if self.training.low_precision and self.layout.sequence_parallel else 1.0)
        if self.executor and self.layout.sequence_parallel:  # one all-gather and one reduce-scatter per
            # sublayer each way (autograd keeps the gathered input: no regather)
            both = sum(self._executor_sp(d))
            return sublayers * both, sublayers * both
        gemm_fwd = sum(op.fwd * self.op_time(op) for op in ops if op.kind == "gemm")
        if self.layout.sequence_parallel:
            fwd = sublayers * (gather_in + half)
            bwd, overlappable = sublayers * (half + half + gather_in), sublayers * (half + gather_in)
        else:
            fwd = sublayers * 2 * half
            bwd = overlappable = sublayers * 2 * half
        return self._tp_exposed(fwd, 0.0, gemm_fwd), self._tp_exposed(bwd, overlappable, 2 * gemm_fwd)

    def _cp_comm(self, kind: LayerKind, d: Degree, core: list[Op]) -> tuple[float, float]:
        """Context parallelism's ring exchange (Transformer Engine's default ``p2p``,
        ``AttnFuncWithCPAndKVP2P``; Liu et al. 2023, Ring Attention): cp - 1 steps, each sending
        this rank's K and V forward (K, V and their gradients backward) to its neighbour while
        attention computes on the chunk it holds; a step is exposed only where the send outlasts
        that chunk's attention. Returns (forward, backward) seconds.

        Step by step, per GPU and micro-batch (pinned in tests/cost_models/test_cost_factors.py):

        - one send: K and V (2) in 16 bits (``ACT_BYTES``) for the ``d.tokens`` this rank holds,
          over its KV heads of ``head_dim``: 2 x 2 x tokens x kv_heads x head_dim bytes;
        - backward sends twice that: K and V travel round the ring again with dK and dV;
        - the ring has cp - 1 sends in each direction: the chunk a rank holds first needs none;
        - the attention a send can hide behind is one chunk's: the layer's core attention time
          (``core``: the fused kernel, or the scores, softmax and values without flash) over cp.
        """
        if d.cp <= 1 or not kind.attention:
            return 0.0, 0.0
        kv_bytes = 2 * self.act_bytes * d.tokens * kv_heads_per_rank(self.model, d.t) * self.model.head_dim
        if self.executor:  # K and V each all-gathered over the cp group forward, reduce-scattered backward
            fwd = 2 * self.coll("all_gather", d.cp * kv_bytes / 2, d.cp_links)
            return fwd, 2 * self.coll("reduce_scatter", d.cp * kv_bytes / 2, d.cp_links)
        send = self.coll("send_recv", kv_bytes, d.cp_links)
        attn_fwd = sum(op.fwd * self.op_time(op) for op in core) / d.cp
        attn_bwd = sum(op.bwd * self.op_time(op) for op in core) / d.cp
        fwd = (d.cp - 1) * max(0.0, send - attn_fwd)
        bwd = (d.cp - 1) * max(0.0, 2 * send - attn_bwd)  # K, V and dK, dV
        return fwd, bwd

    def _titan_cp(self, kind: LayerKind, d: Degree, core: list[Op]) -> tuple[float, float]:
        """PyTorch's context-parallel SDPA under torchtitan (``titan.ring_cp_exposed_s``): keys and
        values all-gathered, their fp32 gradients passed round the ring."""
        if d.cp <= 1 or not kind.attention:
            return 0.0, 0.0
        kv_bytes = 2 * self.act_bytes * d.tokens * kv_heads_per_rank(self.model, d.t) * self.model.head_dim
        gather = self.coll("all_gather", d.cp * kv_bytes, d.cp_links)
        send = self.coll("send_recv", 2 * kv_bytes, d.cp_links)  # fp32 dK, dV
        attn_fwd = sum(op.fwd * self.op_time(op) for op in core)
        attn_bwd = sum(op.bwd * self.op_time(op) for op in core)
        return titan.ring_cp_exposed_s(gather, send, attn_fwd, attn_bwd, d.cp)

    def transition_time(self, t_from: int, t_to: int) -> float:
        """Changing degree between consecutive blocks, per micro-batch. Under sequence
        parallelism every GPU holds tokens [g T/tp, (g+1) T/tp) at a block boundary whatever the
        degree, so the change is free. Otherwise a degree-t block leaves its TP group's share
        replicated on the group: growing to t' > t all-gathers t'/t shares forward (backward
        slices locally); shrinking slices forward and all-gathers the gradient backward."""
        if t_from == t_to or self.layout.sequence_parallel:
            return 0.0
        lo, hi = sorted((t_from, t_to))
        nbytes = self.act_bytes * self.stage_tokens * self.model.hidden_size * hi / self.layout.tp
        gather = self.coll("all_gather", nbytes, self.cluster.strided_links(0, lo, hi // lo))
        regrown = self.layout.recompute == "full" and t_to > t_from
        return gather * (2 if regrown else 1)

    # ---- memory and gradient sync of one block -------------------------------------------------
    def block_params(self, block: Block, t: int, last_stage_ties: bool = False) -> tuple[float, float]:
        """(non-expert, expert) parameters of a block on one GPU at degree t."""
        etp = self.layout.expert_tp if self.layout.folded else t
        return _block_params(self.model, block, t, self.layout.ep, last_stage_ties, etp)

    def gemm_params(self, block: Block, t: int) -> float:
        """Weights of the block's low-precision GEMMs on one GPU (none in the embedding and LM
        head, which stay in 16 bits; norms and biases are not GEMM weights)."""
        if block in (EMBED, HEAD):
            return 0.0
        dense, expert = self.block_params(block, t)
        return dense + expert - self.model.layer_tp_replicated_params(block)

    def weight_bytes(self, block: Block, t: int) -> float:
        """Bytes per parameter of the block's primary weights: 16-bit, except that low-precision
        primary weights (``fp8_params``, Megatron's ``--fp8-param-gather``) cover only the GEMM
        weights of Transformer Engine layers; the embedding, LM head and norms stay 16-bit."""
        tr = self.training
        if not tr.fp8_params:  # (the spec allows it only with a low-precision format)
            return ACT_BYTES
        dense, expert = self.block_params(block, t)
        n, g = dense + expert, self.gemm_params(block, t)
        return (ACT_BYTES * (n - g) + tr.param_bytes * g) / n if n else ACT_BYTES

    def block_facts(self, block: Block, t: int) -> BlockFacts:
        """Everything ``stage_cost`` reads of one block at degree t besides its pass, looked up once
        per layout."""
        key = (block, t)
        if key not in self._facts:
            dense, expert = self.block_params(block, t, last_stage_ties=self.layout.pp > 1)
            state, act = self.block_memory(block, t, 1.0)
            logits = self.block_memory(block, t, 0.0)[1] if block == HEAD else 0.0
            self._facts[key] = BlockFacts(
                dense=dense,
                expert=expert,
                gemm=self.gemm_params(block, t) if self.training.low_precision else 0.0,
                weight_bytes=self.weight_bytes(block, t),
                state=state,
                act=act - logits,
                logits=logits,
                working=self.full_recompute_working_bytes(block, t),
            )
        return self._facts[key]

    def block_memory(self, block: Block, t: int, held: float) -> tuple[StateBytes, float]:
        """(model state, activation bytes) of one block on one GPU when ``held`` micro-batches
        are in flight. Model state is sharded (ZeRO level ``layout.zero``) over every rank
        holding the same shard: the in-stage copies times dp x cp (experts: their expert-data-
        parallel group)."""
        key = (block, t)
        if key not in self._state:
            self._state[key] = self._block_memory(block, t)
        state, per_micro_batch = self._state[key]
        act = per_micro_batch * held
        if block == HEAD:
            d = self.degree(t)
            tr = self.training
            act += head_activation_bytes(self.model, tr.seq_len, d.seqs, t, d.cp, tr.fused_cross_entropy)
        return state, act

    def _block_memory(self, block: Block, t: int) -> tuple[StateBytes, float]:
        """(model state, activation bytes per micro-batch in flight) of one block on one GPU."""
        lay, tr = self.layout, self.training
        d = self.degree(t)
        dense, expert = self.block_params(block, t, last_stage_ties=lay.pp > 1)
        gemm = self.gemm_params(block, t) if tr.low_precision else 0.0
        shards = (d.dp_ranks, d.expert_dp_links.size)
        parts = [
            state_bytes(
                n,
                tr.dtype,
                ranks,
                zero=lay.zero,
                grad_bytes=tr.grad_bytes,
                param_bytes=self.weight_bytes(block, t),
                lp_copy_bytes=self.lp_copy_bytes,
                gemm_params=gemm * n / (dense + expert) if dense + expert else 0.0,
                precision_aware=tr.precision_aware_optimizer,
            )
            for n, ranks in zip((dense, expert), shards, strict=True)
        ]
        state = StateBytes(*(sum(getattr(p, name) for p in parts) for name in _STATE_FIELDS))
        return state, self.block_activation_bytes(block, t)

    def full_recompute_working_bytes(self, block: Block, t: int) -> float:
        """Under full recompute, one layer's complete activations live while it is recomputed."""
        if self.layout.recompute != "full":
            return 0.0
        return self.block_activation_bytes(block, t, recompute="none")

    def block_activation_bytes(self, block: Block, t: int, recompute: str | None = None) -> float:
        """Bytes one micro-batch leaves on a GPU for the backward pass of this block (under the
        layout's recompute mode unless ``recompute`` says otherwise)."""
        d, lay = self.degree(t), self.layout
        if block == HEAD and self.model.mtp_layers:  # the multi-token prediction modules' saved tensors
            tr = self.training
            linear = saved_input_bytes(tr.dtype)
            args = (tr.seq_len, d.seqs, t, lay.sequence_parallel, recompute or lay.recompute, tr.flash_attention, d.cp)
            return mtp_activation_bytes(self.model, *args, linear_input_bytes=linear, etp=d.etp)
        if block in (EMBED, HEAD):
            return 0.0
        return activation_bytes_per_layer(
            self.model,
            block,
            self.training.seq_len,
            d.seqs,
            t,
            lay.sequence_parallel,
            recompute or lay.recompute,
            self.training.flash_attention,
            d.cp,
            linear_input_bytes=saved_input_bytes(self.training.dtype),
            etp=d.etp,
            modules=() if (recompute or lay.recompute) == "full" else lay.recompute_modules,
        )


_STATE_FIELDS = tuple(f.name for f in fields(StateBytes))


@dataclass(frozen=True)
class BlockFacts:
    """One block at one degree in one layout: parameters on a GPU (non-expert, expert, of them
    low-precision GEMM weights), bytes per weight, model state, activation bytes per micro-batch
    in flight (the LM head's logits apart: they live once), and full recompute's working bytes."""

    dense: float
    expert: float
    gemm: float
    weight_bytes: float
    state: StateBytes
    act: float
    logits: float
    working: float


@lru_cache(maxsize=65536)
def _block_params(
    model: ModelSpec, block: Block, t: int, ep: int, last_stage_ties: bool, etp: int
) -> tuple[float, float]:
    """``CostEnv.block_params``, shared by every layout of a search (it depends on nothing else):
    routed experts split over etp x ep, the rest over t."""
    if block == EMBED:
        return embedding_params_per_gpu(model, t), 0.0
    if block == HEAD:  # with the multi-token prediction modules, whose routed experts split over etp x ep
        mtp = mtp_params_per_gpu(model, t, ep, last_stage_ties, etp)
        expert = model.mtp_layers * model.layer_expert_params(model.mtp_layer_kind) / (etp * ep) if mtp else 0.0
        return head_params_per_gpu(model, t, last_stage_ties) + mtp - expert, expert
    expert = model.layer_expert_params(block)
    return layer_params_per_gpu(model, block, t, ep, etp) - expert / (etp * ep), expert / (etp * ep)


def pass_cache_key(layout: ParallelLayout) -> tuple:
    """What a block's forward/backward pass depends on besides the block and its degree:
    layouts with the same key can share one ``CostEnv`` pass cache."""
    return (
        layout.tp,
        layout.cp,
        layout.ep,
        layout.micro_batch,
        layout.recompute,
        layout.recompute_modules,
        layout.sequence_parallel,
        layout.tp_comm_overlap,
        layout.expert_tp,
        layout.moe_dispatcher,
        layout.moe_overlap,
    )
