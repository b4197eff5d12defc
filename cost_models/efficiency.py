"""How close kernels and links get to their datasheet peaks: the cost model's fitted part.

Every constant has a physical meaning. Ten are fitted, together, by
``benchmarks/fit_efficiency.py`` to 296 published runs (tables A-D of
``shared/reference/calibration.md``; table E, ``cost_models.published_runs``; table F,
``cost_models.published_dgxc``): the sustained GEMM fraction of each architecture and number
format, the fused-attention fraction of each architecture and kernel, and the fixed per-step
overhead, each pulled towards a prior from kernel benchmarks. Predicting each source from a fit
on the others (``--holdout``) gives a mean error of 4-9% per source. The rest are held at values
with a stated source.

GEMMs. A GEMM of m x n x k runs at ``peak x gemm_max x shape(m, n, k)``: ``gemm_max`` is the
sustained fraction of the format's dense peak that large GEMMs reach inside training (clock
throttling and contention included); ``shape`` is the product of d / (d + d_half) over the three
dimensions (tile and wave quantisation, prologue and epilogue: small shards run further from
peak). ``d_half`` is the work one SM does during a tile's fixed latency, so it grows with the
tensor throughput of one SM: ``gemm_half_dim`` is its value on an A100 in bf16 (2.9 TFLOP/s per
SM) and a GPU or format k times faster per SM has k times that (an H100 in fp8: 5.2x).

Every kernel also costs ``kernel_overhead_s`` (launch and tail between dependent kernels), which
is what makes small models slow on fast GPUs.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cost_models.profile import Profile
from cost_models.titan import TitanSettings
from topologies.errors import InputError

A100_BF16_FLOPS_PER_SM = 312e12 / 108  # the reference GPU of gemm_half_dim (A100 datasheet, 108 SMs)
FORMAT_CLASS = {"fp16": "16-bit", "bf16": "16-bit", "fp8": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}


class Efficiency(BaseModel):
    """Achievable fractions of peak, per kernel family and link."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gemm_max: dict[str, dict[str, float]] = Field(
        default={
            "ampere": {"16-bit": 0.71},
            "hopper": {"16-bit": 0.64, "fp8": 0.64},
            "blackwell": {"16-bit": 0.58, "fp8": 0.57, "fp4": 0.63},
            "cpu": {"16-bit": 1.0},
        },
        description="Sustained fraction of the dense peak that large GEMMs reach inside training, per "
        "architecture and format class (fp8 covers mxfp8). Fitted (benchmarks/fit_efficiency.py): ampere "
        "16-bit by table A, hopper 16-bit by tables B and F, hopper fp8 by tables C-F, blackwell 16-bit by "
        "table F's GB200 bf16 runs, blackwell fp8 by tables E-F, fp4 by table E. Isolated cuBLAS GEMMs reach "
        "70-80% (the prior); training loses the rest to clocks under power caps and to kernels that share "
        "the GPU. A local CPU cluster's peak is the rate `ntp profile` measured: fraction 1.",
    )
    gemm_half_dim: float = Field(
        default=64.0,
        description="On an A100 in bf16, a GEMM dimension of this size runs at half speed along that "
        "dimension; scaled by the tensor FLOP/s of one SM for other GPUs and formats. Fitted once to table A "
        "(SC'21) and held: the published runs use GEMMs too large to pin it down again.",
    )
    grouped_gemm_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Fraction of a dense GEMM's rate that the grouped expert GEMMs of an MoE layer reach at the "
        "same shape (Transformer Engine's grouped GEMM: one launch over the local experts). Fitted with "
        "grouped_gemm_half_dim and moe_host_sync_s to table G (cost_models.published_moe, 131 runs; "
        "Nelder-Mead on the mean |error|): it runs to its bound of 1 (half-dimension 55 against the dense 64), "
        "so once the router, permutes, load imbalance and host syncs are costed a grouped GEMM is costed as "
        "a dense GEMM of one expert's shape (rows received x width): 1 and 64 are kept.",
    )
    grouped_gemm_half_dim: float = Field(
        default=64.0,
        gt=0,
        description="gemm_half_dim for grouped expert GEMMs (same A100-bf16 scale, same scaling to other GPUs): "
        "the expert's rows, width and hidden size each run at d / (d + half). Table G's fit gives 55, no "
        "larger than the dense 64 (see grouped_gemm_fraction), so the dense figure is kept.",
    )
    moe_load_cv: float = Field(
        default=0.05,
        ge=0,
        description="Coefficient of variation of one expert's load across the experts of an MoE layer after "
        "load balancing, beside the sampling noise of its rows (cost_models.moe.imbalance_factor). DeepSeek-V3 "
        "(arXiv 2412.19437, section 4.5.2) keeps the batch-wise maximal violation of balanced load near 0.1 "
        "over 256 experts with its aux-loss-free bias, a cv of about 0.1 / 2.8 (the expected largest of 256 "
        "normal draws): 0.05 rounds it up. Table G's recipes force balanced routing, where only the sampling "
        "noise is left, so this is a sourced figure, not a fitted one.",
    )
    moe_host_sync_s: dict[str, float] = Field(
        default={"alltoall": 0.003, "allgather": 0.003, "flex": 0.0, "flex_scaleout": 0.003},
        description="Seconds an MoE layer stalls per micro-batch on its device-to-host syncs, per dispatcher "
        "(``flex_scaleout``: flex when its group spans NVLink domains). The dropless all-to-all and all-gather "
        "dispatchers take each peer's and each expert's row count on the host (the all-to-all's split sizes, "
        "``tokens_per_expert`` for the grouped GEMM, in Megatron-Core's token dispatchers), which drains the "
        "CPU's launch queue, so the GPU then waits for the launches of the rest of the layer; DeepEP's internode "
        "kernels wait on the host for the received counts alike; inside one domain DeepEP and HybridEP hand "
        "the counts over on the GPU. Fitted to table G (cost_models.published_moe), the padded token-drop runs "
        "and the CUDA-graphed runs without a stall (their inputs say so): first (issue 24 round 1) alltoall 6 ms, "
        "flex 0, flex_scaleout 4 ms; refitted (round 2, 2026-12-06) beside grouped_gemm_launch_s, whose launches "
        "the old figures had stood for in part: alltoall 3 ms and flex_scaleout 3 ms (table G 9.7%; the surface "
        "is flat, 9.7-9.9% for 1-3 ms with 15-20 us launches; 10.8% back at 6 and 4 ms). allgather has no run "
        "in table G and takes alltoall's figure. Padded token "
        "dropping (TrainingSpec.moe_pad_to_capacity: Megatron's drop_and_pad fixes every count) and "
        "full-iteration CUDA graphs (TrainingSpec.cuda_graphs) remove the stall.",
    )
    moe_attention_reselect_s: float = Field(
        default=0.006,
        ge=0,
        description="Host seconds per micro-batch of an MoE layer whose attention differs from the previous "
        "layer's (cost_models.moe.attention_switch_fraction: GPT-OSS alternates a 128-token sliding window with "
        "full attention). Transformer Engine's DotProductAttention keeps one cached backend choice "
        "(``_attention_backends['attention_params']``, transformer_engine/pytorch/attention) and re-runs "
        "``get_attention_backend`` (its Python checks and cuDNN's support query) whenever the parameters, the "
        "window among them, differ from the last call's: every layer when windows alternate. The MoE "
        "dispatcher's host sync keeps the host from running more than a layer ahead, so the GPU waits for "
        "the longer of that sync's stall and this re-selection (CostEnv._host_sync_s takes the larger); full-"
        "iteration CUDA graphs and padded token dropping (no sync) hide it. Fitted to table G (GPT-OSS, the "
        "one model there that alternates, decides it): flat from 6 to 7 ms, mean |error| 14.2% -> 13.1% when "
        "added. Hold-out: releases <= 26.02.01 leave it free (their GPT-OSS runs pay the all-to-all's 6 ms "
        "anyway), and the later releases, predicted, go from 12.6% to 10.7%; fitted without one GPU's runs it "
        "is 6 ms without B200, B300 or GB200 (each held out improves) and 8-10 ms without GB300 or H100 (held "
        "out, worse: 8.6% -> 9.7%, 14.0% -> 19.2%).",
    )
    grouped_gemm_launch_s: float = Field(
        default=1.5e-5,
        ge=0,
        description="Host seconds per expert GEMM issued one expert at a time (cost_models.moe.grouped_gemm_launch_s: "
        "Transformer Engine's GroupedLinear loops over the local experts on the host, one cuBLAS GEMM each, "
        "with its descriptors and heuristic query; 6 per local expert per micro-batch), on the GPU's critical "
        "path since the MoE layer's host syncs keep the host from running ahead; none in a full-iteration CUDA "
        "graph. The same on every architecture: Transformer Engine's nvte_multi_tensor_gemm "
        "(common/gemm/cublaslt_gemm.cu) takes its CUTLASS grouped GEMM only on Hopper (sm 90) and only with "
        "NVTE_USE_CUTLASS_GROUPED_GEMM=1 (default off), else multi_stream_cublas_gemm, one cuBLAS GEMM per "
        "expert; the single cuBLASLt grouped GEMM (counts on the device, cuBLAS 13.3+) is the graph-capturable "
        "path. Prior: 5-20 us (a cublasLt heuristic query and launch). Fitted to table G "
        "(cost_models.published_moe, 2026-12-06) with moe_overlap_host_s and moe_host_sync_s: 15 us (table G "
        "11.2% without it). Out of sample: fitted on releases <= 26.02.01 it is 20 us, and the later releases "
        "go 10.7% -> 10.6% (over 20%: 10 -> 5); leaving one GPU out it is 15-20 us.",
    )
    moe_overlap_host_s: float = Field(
        default=0.012,
        ge=0,
        description="Host seconds of one MoE layer's forward and backward pair under Megatron's combined 1F1B "
        "A2A overlap without CUDA graphs (cost_models.moe.overlap_host_floor_s: some ten ScheduleNode calls, "
        "each a stream switch under an event wait, each backward its own autograd-engine call); a layer with "
        "less GPU work waits for the host. Fitted to table G (cost_models.published_moe, 2026-12-06) with "
        "grouped_gemm_launch_s: 12 ms (table G 10.6% without it), set by Qwen3-30B-A3B on H100 (1.8x slower "
        "with the overlap than without) and GPT-OSS on GB200; a layer of the larger models has more GPU work "
        "than that and pays nothing. Out of sample: 12 ms on releases <= 26.02.01 alone; 12-14 ms leaving any "
        "one GPU or model out.",
    )
    attention_exp_head_dim: dict[str, float] = Field(
        default={"blackwell": 128.0, "hopper": 64.0},
        description="Head dim below which fused attention is bound by the softmax's exponentials, per "
        "architecture: the kernel then runs head_dim / this as fast per FLOP (its time per score is the "
        "exponential's, whatever the head's width). The forward executes 4 d FLOPs per score and one "
        "exponential: dense bf16 tensor FLOPs per SM and clock over 4 x the SFU's 16 exponentials per SM and "
        "clock, 8,192 / 64 = 128 on Blackwell (B200: 2.25 PFLOP/s over 148 SMs at 1.9 GHz; 'Inside NVIDIA "
        "Blackwell Ultra', 2025: 5 TeraExponentials/s), 4,096 / 64 = 64 on Hopper (989 TFLOP/s over 132 SMs "
        "at 1.83 GHz; 16 MUFU.EX2 per SM and clock): FlashAttention-4's premise. The backward executes 10 d "
        "FLOPs a score with one exponential (it recomputes the probabilities), so it is bound only below 2.5 "
        "times narrower heads (Efficiency._exp_bound): a 64-wide head on Blackwell runs its forward at half "
        "rate, the kernel at 3.5 / 4.5; fp8 attention doubles the GEMMs' rate, so a 128-wide head's forward is "
        "bound then. Sourced, not fitted: table G agrees (mean |error| 12.1% -> 11.8%, runs over 20% 27 -> 25, "
        "with GPT-OSS's 64-wide heads and the fp8-attention runs); no run of tables A-F has a narrower head.",
    )
    attention_speedup: dict[str, float] = Field(
        default={"B300": 2.0, "GB300": 2.0},
        description="Speed-up of fused attention on these GPUs over their architecture's flash_efficiency. "
        "Blackwell Ultra (B300, GB300) doubles the SFU's exponential throughput, 10.7 against Blackwell's 5 "
        "TeraExponentials/s, for '2X attention-layer acceleration' (NVIDIA technical blog 'Inside NVIDIA "
        "Blackwell Ultra', 2025); on Blackwell the softmax's exponentials, one per score, bound the attention "
        "kernel as much as its tensor cores at head dims up to 128 (16 exponentials and 8,192 bf16 FLOPs per "
        "SM and clock against 4 d FLOPs per score forward: FlashAttention-4's premise). Sourced, not fitted: "
        "table G's B300 / GB300 runs agree (mean |error| 15.0% -> 14.2%); tables A-F have none.",
    )
    gemm_tile: dict[str, tuple[int, int, int]] = Field(
        default={"blackwell": (256, 256, 2), "hopper": (128, 256, 1)},
        description="The output tile of a large GEMM kernel, per architecture: its width along a weight dimension, "
        "its width along the token dimension, and the SMs one tile occupies. Blackwell's tcgen05.mma runs on a pair "
        "of SMs (cta_group::2) with M = 256 across the pair and N up to 256 (CUTLASS 'Blackwell SM100 GEMMs', "
        "media/docs/cpp/blackwell_functionality.md); Hopper's wgmma is 64 rows a warpgroup, two consumer "
        "warpgroups a 128 x 256 tile on one SM (CUTLASS sm90 kernels). cuBLAS puts the weight's output dimension "
        "on M (column-major C^T = W X^T). A weight dimension that is not a multiple of the tile computes its last "
        "tile in full (tile_quantisation); an expert's GEMMs fill the SMs in waves of tiles "
        "(cost_models.moe.expert_waves). Sourced, not fitted. Most weight dimensions of tables A-F are whole "
        "tiles; the TP shards that are not move E and F a little (Nemotron-340B's 2,688-wide QKV shard at TP 8 "
        "on GB200, Llama 2 7B's 2,752-wide MLP shard at TP 4 on H100, Llama 3.1 405B's 32,128-row vocabulary "
        "shard: E 4.717% -> 4.718%, F 5.682% -> 5.663%; A-D and H unchanged); GPT-OSS's 2,880 (11.25 tiles of "
        "256, 22.5 of 128) and MLA's 576-wide KV down-projection move G.",
    )
    expert_gemm_streams: int = Field(
        default=4,
        ge=1,
        description="Expert GEMMs that share the GPU at once when Transformer Engine issues them one expert at a "
        "time (cost_models.moe.expert_waves): nvte_multi_tensor_gemm puts expert i on compute stream i mod "
        "get_num_compute_streams(), a constant 4 (transformer_engine/common/util/multi_stream.cpp). Under a "
        "full-iteration CUDA graph the experts' static buffers (Megatron's moe_expert_rank_capacity_factor) need "
        "TE's op fuser, whose graph-safe GroupedLinear (transformer_engine/pytorch/ops/basic/grouped_linear.py) "
        "runs one cuBLASLt grouped GEMM (common/gemm/cublaslt_grouped_gemm.cu) over every local expert's tiles; "
        "torchtitan's torch._grouped_mm is one kernel too (CostEnv._expert_waves). Sourced, not fitted.",
    )
    power_rate_exponent: float = Field(
        default=0.578,
        ge=0,
        description="How a GPU's sustained tensor rate grows with its board power at the same silicon and "
        "datasheet peak: rate x (tdp_watts / peak_basis_watts) ** this (power_headroom). NVIDIA's own pair of "
        "one Blackwell die at two power limits quotes B200 at 2.25 PFLOP/s dense bf16 for 1,000 W and GB200 at "
        "2.5 for 1,200 W: ln(2.5 / 2.25) / ln(1.2) = 0.578. Blackwell Ultra repeats those bf16 / fp8 peaks at "
        "more power (B300 1,100 W, GB300 1,400 W; SemiAnalysis 'GB300 & B300' 2024: part of the gain is the "
        "extra 200 W), so its GEMMs run 1.057x (B300) and 1.093x (GB300) the rate the Blackwell fraction gives; "
        "GB200 against B200 is in the datasheets already. Sourced, not fitted (table G 9.47% -> 8.94% with it; no run "
        "of tables A-F or H is on Blackwell Ultra).",
    )
    flash_efficiency: dict[str, dict[str, float]] = Field(
        default={
            "ampere": {"cudnn": 0.53, "flash2": 0.53},
            "hopper": {"cudnn": 0.54, "flash2": 0.33},
            "blackwell": {"cudnn": 0.46, "flash2": 0.25},
            "cpu": {"cudnn": 1.0, "flash2": 1.0},
        },
        description="Fraction of the bf16 peak fused attention reaches on the FLOPs it executes (the causal "
        "half of the scores; backward executes 2.5x forward), per architecture and kernel: forward and "
        "backward rates combined. FlashAttention-2 on A100 (Dao 2023): about 65% forward, 50% backward. On "
        "H100 (Shah et al. 2024, FlashAttention-3 paper, causal, head dim 128): FlashAttention-2 about 35% "
        "forward and 30% backward, FlashAttention-3 / cuDNN about 60% and 47%. Fitted for hopper and "
        "blackwell cuDNN and hopper FlashAttention-2 (benchmarks/fit_efficiency.py; the long-context runs "
        "of table E pin them); the others are the papers' figures (no published run uses them). A local "
        "CPU cluster's peak is the rate `ntp profile` measured, so its fractions are 1.",
    )
    hbm_efficiency: float = Field(
        default=0.85,
        description="Fraction of HBM bandwidth memory-bound kernels (norms, casts, softmax) reach: a streaming "
        "copy sustains about 90% of the datasheet rate (3.0-3.1 of 3.35 TB/s on H100, CUDA-event timed), fused "
        "elementwise kernels a little less.",
    )
    kernel_overhead_s: float = Field(
        default=2e-6,
        description="Fixed time per kernel: launch, ramp-up and tail between dependent kernels (a few "
        "microseconds on every NVIDIA GPU; NVIDIA's 'Getting Started with CUDA Graphs' blog measures about "
        "2 us of overhead per short kernel launched back to back).",
    )
    nvlink_efficiency: float = Field(
        default=0.8, description="NCCL bus bandwidth over NVLink / one-way link rate (nccl-tests on DGX)."
    )
    scaleout_efficiency: float = Field(
        default=0.9, description="NCCL bus bandwidth over InfiniBand / NIC line rate, within one leaf switch."
    )
    spine_efficiency: float = Field(
        default=0.85,
        description="Further fraction of NIC bandwidth a collective keeps when its traffic crosses spine "
        "switches (assumed: flows that leave a scalable unit share spine uplinks and collide under ECMP "
        "hashing); with it the model follows table B's strong scaling from 96 to 4,608 GPUs within 4%.",
    )
    tp_overlap_hidden: float = Field(
        default=0.7,
        description="Fraction of TP communication that userbuffers overlap hides behind the GEMMs it is "
        "pipelined with (Transformer Engine comm-GEMM overlap; never more than the GEMM time).",
    )
    step_overhead_s: float = Field(
        default=0.055,
        description="Fixed time per step outside forward and backward: data loading, loss and grad-norm "
        "reductions, learning-rate update, logging, launches of the optimizer kernels (Megatron-LM's "
        "per-iteration timers log tens of milliseconds for these). Fitted (benchmarks/fit_efficiency.py).",
    )
    profile: Profile | None = Field(
        default=None,
        description="Times measured on the target machine (`ntp profile`): where they cover a block's shape or "
        "a collective's group they replace the analytical term (StepCost.notes lists where they did not), and "
        "their calibration's per-step overhead replaces step_overhead_s.",
    )
    host_ranks: int | None = Field(
        default=None,
        ge=1,
        description="Ranks sharing the cores of a CPU host whose profile is used (`ntp validate`'s processes); "
        "with more ranks than cores each rank computes that much slower. None: the cluster's GPUs on one host.",
    )
    runtime: Literal["megatron", "executor", "torchtitan"] = Field(
        default="megatron",
        description="What runs the step. 'megatron': Megatron-Core's overlaps (backward TP collectives beside "
        "GEMMs, bucketed gradient reduction, batched pipeline sends). 'executor': ntp-planner's own executor "
        "(`ntp validate`), whose collectives are synchronous: nothing overlaps, gradients are all-reduced one "
        "tensor at a time, the LM head gathers whole logits, context parallelism all-gathers keys and values, "
        "and a pipeline message is sent by a stage's first rank and broadcast to the rest. 'torchtitan': "
        "torchtitan's FSDP2, ring-attention CP, per-op SAC, torchao float8, torch.compile and its memory "
        "(cost_models.titan, with the settings and fitted constants of ``titan``).",
    )
    titan: TitanSettings = Field(
        default_factory=TitanSettings,
        description="torchtitan's job settings and runtime constants; read only when runtime is 'torchtitan'.",
    )

    def with_profile(
        self, profile: Profile | None, runtime: str | None = None, host_ranks: int | None = None
    ) -> Efficiency:
        """These constants with ``profile``'s measurements (and its calibrated overhead) on top."""
        update: dict = {"profile": profile, "host_ranks": host_ranks}
        if profile is not None and profile.calibration.step_overhead_s is not None:
            update["step_overhead_s"] = profile.calibration.step_overhead_s
        if runtime is not None:
            update["runtime"] = runtime
        return self.model_copy(update=update)

    def attention_fraction(
        self, architecture: str, kernel: str, gpu: str = "", head_dim: int = 0, tensor_speedup: float = 1.0
    ) -> float:
        """The fused-attention fraction of ``architecture`` (times ``gpu``'s ``attention_speedup``) at
        ``tensor_speedup`` times the bf16 tensor rate (2 for fp8 attention), less what the softmax's
        exponentials bind for heads as narrow as ``head_dim`` (``_exp_bound``); no fallback for an
        architecture not listed."""
        fraction = _lookup(self.flash_efficiency, "flash_efficiency", architecture, kernel)
        return fraction * self.attention_speedup.get(gpu, 1.0) * self._exp_bound(architecture, head_dim, tensor_speedup)

    def _exp_bound(self, architecture: str, head_dim: int, tensor_speedup: float = 1.0) -> float:
        """The fused-attention rate of a ``head_dim``-wide head whose GEMMs run ``tensor_speedup``
        times the bf16 rate, over the bf16 kernel's unbound: the forward (4 d FLOPs a score, 1 of
        the kernel's 3.5 units) takes the longer of its GEMMs and ``attention_exp_head_dim / d`` for
        its exponentials, the backward (10 d FLOPs and one exponential a score, 2.5 units) of its
        GEMMs and 2.5 times less. fp8 (2x) speeds a 128-wide head on Blackwell by 3.5 / 2.25.

        >>> b = DEFAULT_EFFICIENCY._exp_bound
        >>> round(b("blackwell", 64), 4), b("hopper", 64), round(b("blackwell", 128, 2.0), 4), b("hopper", 128, 2.0)
        (0.7778, 1.0, 1.5556, 2.0)
        """
        bound = self.attention_exp_head_dim.get(architecture, 0.0)
        exp = bound / head_dim if head_dim > 0 else 0.0
        fwd, bwd = max(1.0 / tensor_speedup, exp), max(1.0 / tensor_speedup, exp / 2.5)
        return 3.5 / (fwd + 2.5 * bwd)

    def tile_factor(self, architecture: str, n: int, k: int) -> float:
        """``tile_quantisation`` of a GEMM with weight dimensions ``n`` x ``k`` on the weight-dimension
        width of ``architecture``'s tile (``gemm_tile``; 1 for an architecture without one)."""
        tile = self.gemm_tile.get(architecture)
        return tile_quantisation(n, k, tile[0]) if tile else 1.0

    def power_headroom(self, tdp_watts: float, peak_basis_watts: float | None, dtype: str) -> float:
        """How much faster than its datasheet peak says a GPU's GEMMs in ``dtype`` run when it draws
        ``tdp_watts`` but repeats the peaks of a part rated at ``peak_basis_watts``
        (``GPUSpec.peak_basis_watts``): ``(tdp / basis) ** power_rate_exponent``; 1 without a basis
        and for fp4, whose Blackwell Ultra peak is its own.

        >>> headroom = DEFAULT_EFFICIENCY.power_headroom
        >>> round(headroom(1400, 1200, "bf16"), 4), headroom(1400, 1200, "nvfp4"), headroom(1000, None, "bf16")
        (1.0932, 1.0, 1.0)
        """
        if peak_basis_watts is None or FORMAT_CLASS[dtype] == "fp4":
            return 1.0
        return (tdp_watts / peak_basis_watts) ** self.power_rate_exponent

    def gemm_peak_fraction(self, architecture: str, dtype: str) -> float:
        """The sustained GEMM fraction of ``architecture`` in ``dtype``'s format class. There is
        no fallback: a GPU generation without a fitted or stated figure is an error, not a
        silent guess (an earlier version used 0.63 for any unknown GPU)."""
        return _lookup(self.gemm_max, "gemm_max", architecture, FORMAT_CLASS[dtype])

    def half_dim(self, flops_per_s_per_sm: float) -> float:
        """``gemm_half_dim`` scaled by how much faster one SM is than an A100's in bf16."""
        return self.gemm_half_dim * flops_per_s_per_sm / A100_BF16_FLOPS_PER_SM

    def shape_factor(self, m: int, n: int, k: int, half: float | None = None) -> float:
        """Product of d / (d + half) over the three GEMM dimensions (1 for huge GEMMs)."""
        half = self.gemm_half_dim if half is None else half
        return (m / (m + half)) * (n / (n + half)) * (k / (k + half))


def tile_quantisation(n: int, k: int, tile: int) -> float:
    """Time of a GEMM whose weight is ``n`` x ``k`` over the same GEMM with both dimensions whole
    multiples of ``tile``: each of its three passes computes its output in whole tiles along the
    weight's dimensions (forward: ``n`` wide; data gradient: ``k``; weight gradient: ``n`` x ``k``),
    so a dimension ``d`` costs ``ceil(d / tile) x tile / d``, and the three passes (equal FLOPs)
    average. The token dimension is left out (its rows are many times the tile). A dimension
    narrower than one tile is not padded: cuBLAS runs a narrower kernel there, and the fitted
    ``Efficiency.shape_factor`` already charges a narrow dimension (padding Mixtral's 8-wide router
    output to 256 made its GEMM 21.7x slower on Blackwell).

    >>> round(tile_quantisation(2880, 2880, 256), 5), tile_quantisation(2048, 768, 256)
    (1.09037, 1.0)
    >>> tile_quantisation(8, 4096, 256), round(tile_quantisation(576, 7168, 256), 4)  # router; MLA's KV latent
    (1.0, 1.2222)
    """
    pad_n, pad_k = (math.ceil(d / tile) * tile / d if d >= tile else 1.0 for d in (n, k))
    return (pad_n + pad_k + pad_n * pad_k) / 3


def _lookup(table: dict[str, dict[str, float]], name: str, architecture: str, key: str) -> float:
    """``table[architecture][key]``, or an InputError that names what the table covers."""
    row = table.get(architecture)
    if row is None or key not in row:
        covered = "; ".join(f"{arch}: {', '.join(keys)}" for arch, keys in table.items())
        raise InputError(
            f"Efficiency.{name} has no figure for {architecture} {key} (it covers {covered}); "
            "add one with its source before costing this GPU."
        )
    return row[key]


DEFAULT_EFFICIENCY = Efficiency()
