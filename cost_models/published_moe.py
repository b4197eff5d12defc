"""Table G: every mixture-of-experts pre-training run of NVIDIA's Megatron-Bridge performance
summaries that states its layout, collected from the git history of Megatron-Bridge's
``docs/performance-summary.md`` and ``docs/performance-summary-archive.md`` (releases 25.09 to
26.08; the last version of each release's section, rows repeated unchanged by a later release kept
once, at the newest). NeMo's ``docs/source/performance/`` history (24.03-25.04) has no MoE run.

Left out, with the reason:

- Nemotron 3 Nano / Super / Ultra, Nemotron 3.5 Lightning (57 runs): hybrid Mamba-transformer
  models, not a plain transformer MoE. Qwen3-Next-80B-A3B appeared only in drafts (gated DeltaNet
  hybrid).
- DeepSeek-V4 Flash (26.08, 2 runs): compressed sparse attention, hyper-connections and hash
  routing, not a plain transformer MoE.
- Kimi K2 (26.02.01-26.06, 4 runs): trained with the Muon optimizer (the summaries' note), which
  the cost model does not have (TrainingSpec.optimizer is Adam), and no "kimi-k2" in the catalogue.
- The 25.09 H100 DeepSeek-V3 run with 128x128 blockwise fp8 scaling: only its TFLOP/s is printed,
  and the scaling recipe is not modelled.
- Llama 4 Scout / Maverick, Mixtral, GPT-OSS-20B: no pre-training run in these summaries.

Settings the summaries do not print, per era, from Megatron-Bridge's performance recipes of the
release (``scripts/performance`` at r0.1.0, v0.2.x, v0.3.0, v0.3.1, v0.4.0, v0.4.1/2, v0.5.0,
v0.5.1; ``src/megatron/bridge/perf_recipes`` at v0.6.0). The table's columns win where a recipe
differs (25.11's DeepSeek-V3 and several GBS/EP cells were rerun after the tag):

- Every run: expert tensor parallelism 1 (``expert_tensor_parallel_size=1``: EP folded over the
  attention's TP ranks), grouped GEMM, router fusion, forced load balancing and dropless routing
  (the summaries' note; 25.09 "tokendrop" rows instead drop tokens at capacity factor 1.0 with
  padding, ``apply_moe_token_drop``, without forced balancing: ``TrainingSpec.moe_capacity_factor`` 1.0
  with ``moe_pad_to_capacity``), Megatron's distributed optimizer,
  gradients reduced in bf16, cuDNN attention. Userbuffers TP overlap only in 25.09's Qwen3 runs
  (``CommOverlapConfig(tp_comm_overlap=True)``); DeepSeek-V3's recipe and the later Qwen3-235B
  H100 recipes (the other runs with tp > 1) turn it off. fp8 rows use current (tensorwise)
  scaling, fp8 and mxfp8 rows fp8 primary weights (``fp8_param_gather``).
- Per row, from the recipe (``MoeRecipe``): the dispatcher (``alltoall``, or ``flex`` with DeepEP
  or HybridEP where ``moe_flex_dispatcher_backend`` is set), the overlap of dispatch with compute
  (``moe_a2a_overlap`` = Megatron's ``overlap_moe_expert_parallel_comm``, the 1F1B A2A overlap),
  and the modules recomputed (``recompute_modules``: ``mla_up_proj``, ``mlp``, ``moe_act``,
  ``layernorm``: ``ParallelLayout.recompute_modules``, with ``recompute`` "none" since the layout's
  "selective" means core attention).
- 25.09: DeepSeek-V3 on H100 runs DeepEP with the 1F1B overlap and the layout ``Et|(tt|)*30mL``;
  on B200/GB200 and every Qwen3 run, the all-to-all dispatcher with token dropping.
- 25.11: DeepSeek-V3 without multi-token prediction on GB200/GB300 ("w/o MTP"), with it on B200.
- 26.06 onwards on GB200/GB300 (and Qwen3-30B on B300): full-iteration CUDA graphs, HybridEP with
  the A2A overlap, expert buffers padded to 1.5x the balanced load
  (``moe_expert_rank_capacity_factor``, paged stashing: still dropless); ``TrainingSpec.cuda_graphs``.
  The same recipes run attention in fp8 (``fp8_dot_product_attention``; ``TrainingSpec.fp8_attention``),
  all but DeepSeek-V3's on GB200 (v0.5.0 / v0.5.1 ``*_FP8_MX_V1`` / ``_V2``, v0.6.0's
  ``_enable_*_full_iteration_mxfp8``).
- DeepSeek-V3 pipeline layouts: the recipe's string where it sets one (``Et*4|(t*4|)*14tmL``), else
  ``set_deepseek_v3_pipeline_model_parallel_layout``'s split for pp * vp chunks (4: 16/16/16/13,
  8: 8 * 7 + 5, 16: 4 * 15 + 1, each with the embedding first and MTP and the loss last; 32, not
  in its table, as the 25.09 H100 layout). MTP is one layer from 26.02 on (the recipe's default);
  ``m`` is kept in ``MoeRecipe.pipeline_layout`` and the layer counts leave it out.
- Qwen3-235B-A22B counts the embedding and the loss as pipeline layers
  (``account_for_*_in_pipeline_split``); the other models split their layers evenly.
- Two printed cells give way to the release's recipe (v0.2.2 ``workload_base_configs``), each
  with the evidence: 25.11's GPT-OSS on H100 prints MBS 4 with GA 2, which over its 16
  data-parallel ranks makes GBS 128, not the printed 512; the recipe's MBS 1 (GA 32) does, and
  fits in 80 GB (MBS 4 would take 100 GiB). 25.11's GPT-OSS on B200 prints EP 8; the recipe sets
  EP 64, and its 8,213 tokens/s/GPU is the 8,047 of 26.02's EP 64 run, not the 13,722 of
  26.02.01's EP 8 one (GPT-OSS gained 0-6% between these releases on every other system). The
  other printed rows agree with themselves (GBS = dp x MBS x GA) but for 25.11's Qwen3-235B on
  GB300 (dp 64 x MBS 2 x GA 32 = 4,096, GBS 8,192 printed), kept as printed: a step's time and
  the model's scale alike with GBS, so its error does not depend on which cell is wrong.
- Two more rows give way to their recipe (2026-12-06), both Qwen3-30B-A3B on H100, whose printed
  layout cells repeat the previous release's row while the recipe of their own release changed:
  25.11 prints MBS 2 and VP 24, 25.09's cells (its September 2025 yaml, Megatron-Bridge #729: VP 24,
  fp8 MBS 2); v0.2.x moved to VP 12 with MBS 2 (2025-11-10) and then to VP 12, MBS 1 (the default)
  and the A2A overlap (#1348, 2025-11-21, what v0.2.2 holds and where this row's overlap comes
  from), and the run's 5,275 tokens/s/GPU is 26.02's 5,113 at that layout (MBS 1, VP 12, overlap),
  half of 25.09's 10,494 at MBS 2 without the overlap: per sample 48.5 against 50.1 ms. 26.02.01
  prints PP 2, VP 12, EP 8 (26.02's cells); #2477 ("Update Qwen3 30B H100 Base Configs with
  HybridEP", 2026-02-23, in v0.3.1's ``QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1``) set EP 16
  without pipelining together with HybridEP and no overlap (the dispatcher and overlap this table
  already took from it), and its 9,058 tokens/s/GPU is 26.04's 8,901 at that layout (printed
  there), not 26.02's 5,113 at PP 2. Checked and kept: 25.09's GB200 Qwen3-235B-A22B row (TP 2,
  EP 64) is what the 25.09-era yaml set until 2025-10-11 (the r0.1.0 branch head has TP 1, PP 8,
  EP 8), and its H100 Qwen3-30B-A3B row's VP 24 likewise.
- The dispatcher is the recipe's own, not the printed layout's neighbour's: v0.4.2 (26.04.01) moved
  Qwen3-235B-A22B on B300 from the all-to-all to flex with HybridEP (``moe_flex_dispatcher_backend=
  "hybridep"`` in ``QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_FP8_CS_V1`` and ``moe_token_dispatcher_type =
  "flex"`` in ``qwen3_235b_a22b_pretrain_config_b300``; Megatron-Bridge #3490, "Use HybridEP flex
  dispatcher for Qwen3 235B B300 perf configs"), and the run's 5,936 tokens/s/GPU is 22% above 26.04's
  4,865 at the same printed layout with the all-to-all. Every other row's dispatcher, overlap, MBS,
  TP, PP, VP and EP were compared with its release's recipe (v0.3.0 on, the config of its GPU count and
  GBS): the printed cells differ only for GPT-OSS 26.02.01 on B200 / B300 (EP 8 printed, 64 in the
  recipe; 13,722 / 15,031 tokens/s/GPU against 26.02's 8,047 / 8,359 at EP 64, so the printed EP ran)
  and Qwen3-235B-A22B 26.02.01 on B300 (VP 4 printed, none in the recipe; 2,644 tokens/s/GPU, 26.02's
  2,691 at VP 4, so the printed VP ran), both kept as printed.
- The dispatcher is the one the recipe function leaves, not its base config's backend (2026-12-06,
  round 6): v0.3.1 (26.02.01) gave every Qwen3-235B-A22B base config ``moe_flex_dispatcher_backend=
  "deepep"`` (#2351), but ``qwen3_235b_a22b_pretrain_config_b300`` / ``_b200`` / ``_h100`` then set
  ``moe_token_dispatcher_type = "alltoall"`` (#2393, "Set flex and alltoall for perf jobs"; only the
  GB200 / GB300 and Qwen3-30B-A3B functions set "flex"), and Megatron-Core picks its dispatcher by
  that type alone, so 26.02.01's B300 and H100 runs are the all-to-all's (the backend then only sets
  ``CUDA_DEVICE_MAX_CONNECTIONS`` and the layernorm SM margin in ``perf_plugins.py``). Their
  throughputs agree: 2,644 and 1,611 tokens/s/GPU against 26.02's all-to-all 2,691 and 1,633 at
  the same layouts. Checked and kept: the 25.09 DeepSeek-V3 rows are what the r0.1.0 branch head
  sets ("Cherry pick perf 2509", #959, 2025-10-15: B200 TP 1, PP 16, no VP, no layout string, no
  CUDA graphs, ``mla_up_proj`` recompute; GB200 PP 4, VP 4, ``mla_up_proj`` with token dropping),
  where the September yaml had TP 2 and CUDA graphs on B200, VP 8 and the 32-stage layout on
  GB200 and ``mla_up_proj``, ``mlp``, ``moe_act`` recompute; 25.09's GB200 mxfp8 row (PP 8, EP 64 on
  256 GPUs: 32 GPUs a stage) stays left out, the recipe's PP 4 / VP 4 would be -24% beside its fp8
  twin's -8% (the summary's note gives its mxfp8 a 32 x 32 block scaling, not costed). 25.11's
  Qwen3-235B-A22B B200 prints VP 2 where v0.2.2 sets VP 4 (#1348, with the overlap the row takes);
  no run at VP 4 to compare, so kept (-2.5% as printed, -3.8% at VP 4).
- Recipe settings the cost model does not read, every row: ``moe_router_dtype="fp32"`` (the Qwen3 and
  DeepSeek-V3 providers' default: the gate GEMM in fp32 outside Transformer Engine; the model costs it
  at the low-precision rate), ``moe_permute_fusion``, ``moe_grouped_gemm``, ``moe_router_fusion`` and
  Transformer Engine's fused cross entropy (DeepSeek-V3's native one from v0.5.1), all on; 25.09's
  per-layer CUDA graphs (``enable_cuda_graph``, Megatron's local graphs, possible with the padded
  token dropping) on the Qwen3 GB200 runs; the partial graphs (``cuda_graph_scope``) of later ones.
- GB200 / GB300 runs of 64 GPUs or more use 64 of each NVL72 rack. The 26.06.01 GPT-OSS rows carry
  the summary's note of a cuDNN regression (fixed in 26.08); they are kept as measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from cost_models.catalogue import MODELS
from cost_models.layout import check_layout
from cost_models.model import ModelSpec
from cost_models.pipeline_layout import megatron_split, parse_layout
from cost_models.published_row import PublishedRow, run_layout
from cost_models.training import TrainingSpec
from topologies.cluster_catalogue import CLUSTERS
from topologies.errors import InputError

SYSTEMS = {"H100": "dgx-h100", "B200": "dgx-b200", "B300": "dgx-b300", "GB200": "gb200-nvl72", "GB300": "gb300-nvl72"}
RECIPE_TAGS = {  # release -> Megatron-Bridge tag whose performance recipes it ran
    "25.09": "r0.1.0",
    "25.11": "v0.2.2",
    "26.02": "v0.3.0",
    "26.02.01": "v0.3.1",
    "26.04": "v0.4.0",
    "26.04.01": "v0.4.2",
    "26.06": "v0.5.0",
    "26.06.01": "v0.5.1",
    "26.08": "v0.6.0",
}
_RECOMPUTE = {
    "": (),
    "mla": ("mla_up_proj",),
    "mla+mlp": ("mla_up_proj", "mlp"),
    "mlp": ("mlp",),
    "act": ("moe_act",),
    "ln+act": ("layernorm", "moe_act"),
}
_S16 = "Et*4|(t*4|)*14tmL"
_S32 = "Et|(tt|)*30mL"
_DSV3_SPLITS = {4: "Et*16|t*16|t*16|t*13mL", 8: "Et*8|(t*8|)*6t*5mL", 16: _S16, 32: _S32}


@dataclass(frozen=True)
class MoeRecipe:
    """The MoE settings of one run's recipe that its summary row does not print."""

    dispatcher_backend: str
    """'alltoall', or the flex dispatcher's backend: 'deepep' or 'hybridep'."""
    a2a_overlap: bool
    """Megatron's overlap_moe_expert_parallel_comm (dispatch and combine under another micro-batch)."""
    recompute_modules: tuple[str, ...]
    """Megatron's recompute_modules (selective recompute of these modules only)."""
    pipeline_layout: str | None
    """Megatron's pipeline layout string, multi-token prediction ('m') included; None = even split."""
    mtp_layers: int
    """Multi-token prediction layers trained (DeepSeek-V3)."""
    capacity_factor: float | None
    """Token dropping at this expert capacity factor (padded); None = dropless."""
    etp: int = 1
    """expert_tensor_parallel_size (1 in every recipe)."""


@dataclass(frozen=True)
class MoeRow(PublishedRow):
    """A published MoE run with its recipe's MoE settings."""

    moe: MoeRecipe | None = None
    release: str = ""
    system: str = ""


@dataclass(frozen=True)
class Excluded:
    """A run of table G that cannot be costed as printed, and why."""

    release: str
    system: str
    model: str
    description: str
    reason: str


# fmt: off
# model: [(release, system, format, GPUs, GBS, MBS, seq, TP, PP, CP, VP, EP, tokens/s/GPU,
#          dispatcher, A2A overlap, recompute, explicit pipeline layout, note)]
# note: "drop" = token dropping (25.09 "tokendrop"), "no-mtp" = DeepSeek-V3 without MTP (25.11)
_G = {
    "deepseek-v3": [
        ("25.09", "B200", "fp8-cs", 256, 2048, 1, 4096, 1, 16, 1, 1, 8, 2265, "a2a", False, "mla", None, "drop"),
        ("25.09", "B200", "mxfp8", 256, 2048, 1, 4096, 1, 16, 1, 1, 8, 2159, "a2a", False, "mla", None, "drop"),
        ("25.09", "GB200", "fp8-cs", 256, 2048, 1, 4096, 1, 4, 1, 4, 64, 3454, "a2a", False, "mla", None, "drop"),
        ("25.09", "GB200", "mxfp8", 256, 2048, 1, 4096, 1, 8, 1, 2, 64, 2835, "a2a", False, "mla", None, "drop"),
        ("25.09", "H100", "fp8-cs", 1024, 8192, 1, 4096, 2, 8, 1, 4, 64, 1297, "deepep", True, "mla+mlp", _S32, ""),
        ("25.11", "B200", "mxfp8", 256, 2048, 1, 4096, 1, 16, 1, 1, 8, 2139, "a2a", False, "mla", None, ""),
        ("25.11", "GB200", "bf16", 256, 4096, 1, 4096, 1, 4, 1, 4, 64, 3139, "hybridep", False, "mla", None, "no-mtp"),
        ("25.11", "GB200", "mxfp8", 256, 4096, 1, 4096, 1, 8, 1, 4, 32, 4018, "hybridep", False, "mla", None, "no-mtp"),
        ("25.11", "GB300", "bf16", 256, 4096, 1, 4096, 1, 2, 1, 4, 32, 3848, "hybridep", False, "act", None, "no-mtp"),
        ("25.11", "GB300", "mxfp8", 256, 4096, 1, 4096, 1, 2, 1, 4, 32, 4357, "hybridep", False, "act", None, "no-mtp"),
        ("26.02", "B200", "mxfp8", 256, 4096, 1, 4096, 1, 16, 1, 1, 8, 2689, "hybridep", False, "mla", None, ""),
        ("26.02", "B300", "mxfp8", 256, 4096, 1, 4096, 1, 16, 1, 1, 8, 2983, "hybridep", False, "mla", None, ""),
        ("26.02", "GB200", "mxfp8", 256, 4096, 1, 4096, 1, 4, 1, 4, 64, 3955, "hybridep", False, "mla", None, ""),
        ("26.02", "GB300", "mxfp8", 256, 4096, 2, 4096, 1, 2, 1, 8, 32, 4612, "hybridep", False, "mla", _S16, ""),
        ("26.02.01", "B200", "mxfp8", 256, 4096, 1, 4096, 1, 16, 1, 1, 8, 2790, "hybridep", False, "mla", None, ""),
        ("26.02.01", "B300", "mxfp8", 256, 4096, 1, 4096, 1, 16, 1, 1, 8, 3099, "hybridep", False, "mla", None, ""),
        ("26.02.01", "GB200", "mxfp8", 256, 4096, 1, 4096, 1, 4, 1, 4, 64, 4021, "hybridep", False, "mla", None, ""),
        ("26.02.01", "GB300", "mxfp8", 256, 4096, 2, 4096, 1, 2, 1, 8, 32, 4691, "hybridep", False, "mla", _S16, ""),
        ("26.04", "B200", "mxfp8", 256, 4096, 1, 4096, 1, 16, 1, 1, 8, 2815, "hybridep", False, "mla", None, ""),
        ("26.04", "B300", "mxfp8", 256, 4096, 1, 4096, 1, 16, 1, 1, 8, 3131, "hybridep", False, "mla", None, ""),
        ("26.04", "GB200", "mxfp8", 256, 4096, 1, 4096, 1, 4, 1, 4, 64, 4193, "hybridep", False, "mlp", None, ""),
        ("26.04", "GB300", "mxfp8", 256, 4096, 2, 4096, 1, 2, 1, 8, 32, 4965, "hybridep", False, "mla", _S16, ""),
        ("26.04.01", "B200", "mxfp8", 256, 4096, 1, 4096, 1, 8, 1, 2, 32, 3328, "deepep", True, "mla+mlp", _S16, ""),
        ("26.04.01", "B300", "mxfp8", 256, 4096, 2, 4096, 1, 8, 1, 1, 8, 3456, "hybridep", False, "mla", None, ""),
        ("26.04.01", "GB200", "mxfp8", 256, 4096, 1, 4096, 1, 4, 1, 4, 64, 4256, "hybridep", False, "mlp", None, ""),
        ("26.04.01", "GB300", "mxfp8", 256, 4096, 2, 4096, 1, 2, 1, 8, 32, 4992, "hybridep", False, "mla", _S16, ""),
        ("26.06", "B300", "mxfp8", 256, 4096, 2, 4096, 1, 8, 1, 1, 8, 3541, "hybridep", False, "mla", None, ""),
        ("26.06", "GB200", "mxfp8", 256, 4096, 1, 4096, 1, 4, 1, 4, 64, 4969, "hybridep", True, "mla", None, ""),
        ("26.06", "GB300", "mxfp8", 256, 4096, 1, 4096, 1, 2, 1, 8, 32, 6338, "hybridep", True, "", _S16, ""),
        ("26.06", "GB300", "mxfp8", 256, 15360, 1, 4096, 1, 2, 1, 8, 32, 6422, "hybridep", True, "", _S16, ""),
        ("26.06.01", "GB200", "mxfp8", 256, 4096, 1, 4096, 1, 4, 1, 4, 64, 4928, "hybridep", True, "mla", None, ""),
        ("26.06.01", "GB300", "mxfp8", 256, 4096, 1, 4096, 1, 2, 1, 8, 32, 6304, "hybridep", True, "", _S16, ""),
        ("26.08", "GB200", "mxfp8", 256, 4096, 1, 4096, 1, 4, 1, 4, 64, 4912, "hybridep", True, "mla", None, ""),
        ("26.08", "GB300", "mxfp8", 256, 4096, 1, 4096, 1, 2, 1, 8, 32, 6288, "hybridep", True, "", _S16, ""),
    ],
    "gpt-oss-120b": [
        # the recipe's EP 64 and MBS 1 where 25.11 printed EP 8 (B200) and MBS 4 (H100): see the docstring
        ("25.11", "B200", "bf16", 64, 512, 4, 4096, 1, 1, 1, 1, 64, 8213, "a2a", False, "ln+act", None, ""),
        ("25.11", "GB200", "bf16", 64, 1280, 1, 8192, 1, 1, 1, 1, 64, 15876, "a2a", False, "ln+act", None, ""),
        ("25.11", "GB300", "bf16", 64, 1280, 2, 8192, 1, 1, 1, 1, 64, 18347, "a2a", False, "", None, ""),
        ("25.11", "H100", "bf16", 64, 512, 1, 4096, 1, 4, 1, 1, 8, 5630, "a2a", False, "ln+act", None, ""),
        ("26.02", "B200", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 8047, "a2a", False, "ln+act", None, ""),
        ("26.02", "B300", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 8359, "a2a", False, "", None, ""),
        ("26.02", "GB200", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 15784, "a2a", False, "ln+act", None, ""),
        ("26.02", "GB300", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 19412, "a2a", False, "", None, ""),
        ("26.02", "H100", "bf16", 64, 1280, 1, 4096, 1, 4, 1, 1, 8, 5993, "a2a", False, "ln+act", None, ""),
        ("26.02.01", "B200", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 8, 13722, "a2a", False, "ln+act", None, ""),
        ("26.02.01", "B300", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 8, 15031, "a2a", False, "", None, ""),
        ("26.02.01", "GB200", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 15754, "a2a", False, "ln+act", None, ""),
        ("26.02.01", "GB300", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 19366, "a2a", False, "", None, ""),
        ("26.02.01", "H100", "bf16", 64, 1280, 1, 4096, 1, 4, 1, 1, 8, 5984, "a2a", False, "ln+act", None, ""),
        ("26.04", "B200", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 8, 13045, "hybridep", False, "ln+act", None, ""),
        ("26.04", "B300", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 8, 15114, "hybridep", False, "", None, ""),
        ("26.04", "GB200", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 15938, "hybridep", True, "ln+act", None, ""),
        ("26.04", "GB300", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 19275, "a2a", False, "", None, ""),
        ("26.04", "H100", "bf16", 64, 1280, 1, 4096, 1, 4, 1, 1, 8, 5810, "a2a", False, "ln+act", None, ""),
        ("26.04.01", "B200", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 8, 13568, "hybridep", False, "ln+act", None, ""),
        ("26.04.01", "B300", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 8, 15232, "hybridep", False, "", None, ""),
        ("26.04.01", "GB200", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 16640, "hybridep", True, "ln+act", None, ""),
        ("26.04.01", "GB300", "bf16", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 19200, "a2a", False, "", None, ""),
        ("26.04.01", "H100", "bf16", 64, 1280, 1, 4096, 1, 4, 1, 1, 8, 5824, "a2a", False, "ln+act", None, ""),
        ("26.06", "B300", "mxfp8", 64, 1280, 4, 4096, 1, 1, 1, 1, 8, 18534, "hybridep", False, "", None, ""),
        ("26.06", "GB200", "mxfp8", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 28947, "hybridep", True, "", None, ""),
        ("26.06", "GB300", "mxfp8", 64, 1280, 4, 4096, 1, 1, 1, 1, 16, 33166, "hybridep", True, "", None, ""),
        ("26.06.01", "GB200", "mxfp8", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 18304, "hybridep", True, "", None, ""),
        ("26.06.01", "GB300", "mxfp8", 64, 1280, 4, 4096, 1, 1, 1, 1, 16, 20288, "hybridep", True, "", None, ""),
        ("26.08", "GB200", "mxfp8", 64, 1280, 4, 4096, 1, 1, 1, 1, 64, 28672, "hybridep", True, "", None, ""),
        ("26.08", "GB300", "mxfp8", 64, 1280, 4, 4096, 1, 1, 1, 1, 16, 33024, "hybridep", True, "", None, ""),
    ],
    "qwen3-235b-a22b": [
        ("25.09", "B200", "fp8-cs", 64, 1024, 1, 4096, 1, 8, 1, 2, 8, 4104, "a2a", False, "", None, "drop"),
        ("25.09", "B200", "mxfp8", 64, 1024, 1, 4096, 1, 8, 1, 2, 8, 4275, "a2a", False, "", None, "drop"),
        ("25.09", "GB200", "fp8-cs", 64, 1024, 1, 4096, 2, 1, 1, 1, 64, 4452, "a2a", False, "", None, "drop"),
        ("25.09", "GB200", "mxfp8", 64, 1024, 1, 4096, 2, 1, 1, 1, 64, 4416, "a2a", False, "", None, "drop"),
        ("25.09", "H100", "fp8-cs", 256, 2048, 1, 4096, 2, 8, 1, 4, 32, 1204, "a2a", False, "", None, "drop"),
        ("25.11", "B200", "mxfp8", 64, 1024, 1, 4096, 1, 8, 1, 2, 8, 3269, "a2a", True, "", None, ""),
        ("25.11", "GB200", "bf16", 256, 8192, 1, 4096, 1, 8, 1, 3, 32, 4916, "hybridep", False, "", None, ""),
        ("25.11", "GB300", "bf16", 256, 8192, 2, 4096, 1, 4, 1, 12, 16, 6131, "hybridep", False, "", None, ""),
        ("25.11", "H100", "fp8-cs", 256, 2048, 1, 4096, 2, 8, 1, 4, 32, 1575, "a2a", True, "", None, ""),
        ("26.02", "B200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 1, 8, 3805, "a2a", False, "", None, ""),
        ("26.02", "B300", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 4, 8, 2691, "a2a", True, "", None, ""),
        ("26.02", "GB200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 1, 32, 5448, "hybridep", False, "", None, ""),
        ("26.02", "H100", "fp8-cs", 256, 8192, 1, 4096, 2, 8, 1, 4, 32, 1633, "a2a", True, "", None, ""),
        # the all-to-all v0.3.1 names after the base config's DeepEP (#2393): see the docstring
        ("26.02.01", "B300", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 4, 8, 2644, "a2a", False, "", None, ""),
        ("26.02.01", "GB200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 1, 32, 5530, "hybridep", False, "", None, ""),
        ("26.02.01", "GB300", "mxfp8", 256, 8192, 2, 4096, 1, 4, 1, 1, 32, 6583, "hybridep", False, "", None, ""),
        ("26.02.01", "H100", "fp8-cs", 256, 8192, 1, 4096, 2, 8, 1, 4, 32, 1611, "a2a", True, "", None, ""),
        ("26.04", "B300", "mxfp8", 256, 8192, 2, 4096, 1, 8, 1, 1, 8, 4865, "a2a", False, "", None, ""),
        ("26.04", "GB200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 3, 32, 5672, "hybridep", False, "", None, ""),
        ("26.04", "GB300", "mxfp8", 256, 8192, 2, 4096, 1, 4, 1, 12, 32, 6994, "hybridep", False, "", None, ""),
        ("26.04", "H100", "fp8-cs", 256, 8192, 1, 4096, 2, 8, 1, 4, 32, 1686, "a2a", True, "", None, ""),
        ("26.04.01", "B200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 1, 8, 3776, "a2a", False, "", None, ""),
        # HybridEP from v0.4.2 (#3490; v0.4.0 and v0.4.1 ran the all-to-all): see the docstring
        ("26.04.01", "B300", "mxfp8", 256, 8192, 2, 4096, 1, 8, 1, 1, 8, 5936, "hybridep", False, "", None, ""),
        ("26.04.01", "GB200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 3, 32, 5680, "hybridep", False, "", None, ""),
        ("26.04.01", "GB300", "mxfp8", 256, 8192, 2, 4096, 1, 4, 1, 12, 32, 6944, "hybridep", False, "", None, ""),
        ("26.04.01", "H100", "fp8-cs", 256, 8192, 1, 4096, 2, 8, 1, 4, 32, 1712, "a2a", True, "", None, ""),
        ("26.06", "GB200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 3, 32, 7376, "hybridep", True, "", None, ""),
        ("26.06", "GB300", "mxfp8", 256, 8192, 2, 4096, 1, 4, 1, 12, 32, 9015, "hybridep", True, "", None, ""),
        ("26.06.01", "GB200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 3, 32, 7360, "hybridep", True, "", None, ""),
        ("26.06.01", "GB300", "mxfp8", 256, 8192, 2, 4096, 1, 4, 1, 12, 32, 9008, "hybridep", True, "", None, ""),
        ("26.08", "GB200", "mxfp8", 256, 8192, 1, 4096, 1, 8, 1, 3, 32, 7280, "hybridep", True, "", None, ""),
        ("26.08", "GB300", "mxfp8", 256, 8192, 2, 4096, 1, 4, 1, 12, 32, 8816, "hybridep", True, "", None, ""),
    ],
    "qwen3-30b-a3b": [
        ("25.09", "B200", "fp8-cs", 8, 512, 1, 4096, 1, 1, 1, 1, 8, 18066, "a2a", False, "", None, "drop"),
        ("25.09", "GB200", "fp8-cs", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 22775, "a2a", False, "", None, "drop"),
        ("25.09", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 23723, "a2a", False, "", None, "drop"),
        ("25.09", "H100", "fp8-cs", 16, 512, 2, 4096, 1, 2, 1, 24, 8, 10494, "a2a", False, "", None, "drop"),
        ("25.11", "B200", "mxfp8", 8, 512, 1, 4096, 1, 1, 1, 1, 8, 9299, "a2a", False, "", None, ""),
        ("25.11", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 23766, "hybridep", False, "", None, ""),
        ("25.11", "GB300", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 28934, "hybridep", False, "", None, ""),
        # the recipe's MBS 1 and VP 12 (25.11), and EP 16 without pipelining (26.02.01), where the rows print
        # the cells of the release before: see the docstring
        ("25.11", "H100", "fp8-cs", 16, 512, 1, 4096, 1, 2, 1, 12, 8, 5275, "a2a", True, "", None, ""),
        ("26.02", "B200", "mxfp8", 8, 512, 1, 4096, 1, 1, 1, 1, 8, 9691, "a2a", False, "", None, ""),
        ("26.02", "B300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 29521, "hybridep", False, "", None, ""),
        ("26.02", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 26084, "hybridep", False, "", None, ""),
        ("26.02", "GB300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 30376, "hybridep", False, "", None, ""),
        ("26.02", "H100", "fp8-cs", 16, 1024, 1, 4096, 1, 2, 1, 12, 8, 5113, "deepep", True, "", None, ""),
        ("26.02.01", "B200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 26695, "hybridep", False, "", None, ""),
        ("26.02.01", "B300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 29454, "hybridep", False, "", None, ""),
        ("26.02.01", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 26373, "hybridep", False, "", None, ""),
        ("26.02.01", "GB300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 30411, "hybridep", False, "", None, ""),
        ("26.02.01", "H100", "fp8-cs", 16, 1024, 1, 4096, 1, 1, 1, 1, 16, 9058, "hybridep", False, "", None, ""),
        ("26.04", "B200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 26859, "hybridep", False, "", None, ""),
        ("26.04", "B300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 30553, "hybridep", False, "", None, ""),
        ("26.04", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 26032, "hybridep", False, "", None, ""),
        ("26.04", "GB300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 31470, "hybridep", False, "", None, ""),
        ("26.04", "H100", "fp8-cs", 16, 1024, 1, 4096, 1, 1, 1, 1, 16, 8901, "hybridep", False, "", None, ""),
        ("26.04.01", "B200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 27136, "hybridep", False, "", None, ""),
        ("26.04.01", "B300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 30720, "hybridep", False, "", None, ""),
        ("26.04.01", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 26112, "hybridep", False, "", None, ""),
        ("26.04.01", "GB300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 31744, "hybridep", False, "", None, ""),
        ("26.04.01", "H100", "fp8-cs", 16, 1024, 1, 4096, 1, 1, 1, 1, 16, 8960, "hybridep", False, "", None, ""),
        ("26.06", "B300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 40769, "hybridep", True, "", None, ""),
        ("26.06", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 40706, "hybridep", True, "", None, ""),
        ("26.06", "GB300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 45275, "hybridep", True, "", None, ""),
        ("26.06", "H100", "fp8-cs", 16, 1024, 1, 4096, 1, 1, 1, 1, 16, 8826, "hybridep", False, "", None, ""),
        ("26.06.01", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 40960, "hybridep", True, "", None, ""),
        ("26.08", "GB200", "mxfp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 39936, "hybridep", True, "", None, ""),
        ("26.08", "GB300", "mxfp8", 8, 512, 8, 4096, 1, 1, 1, 1, 8, 44544, "hybridep", True, "", None, ""),
    ],
}
# fmt: on


def tokens_to_step_time_s(batch: int, seq: int, gpus: int, tokens_per_s_per_gpu: float) -> float:
    """Step time of a run quoted in tokens per second per GPU: batch * seq / (tokens/s/GPU * GPUs)."""
    return batch * seq / (tokens_per_s_per_gpu * gpus)


def _pipeline(name: str, pp: int, vp: int, layout: str | None, mtp: int) -> str | None:
    """DeepSeek-V3's layout string (the recipe's, else its split for pp * vp chunks)."""
    if name != "deepseek-v3" or pp == 1:
        return layout
    text = layout or _DSV3_SPLITS.get(pp * vp)
    if text is None:
        raise InputError(f"no DeepSeek-V3 pipeline layout for pp({pp}) * vp({vp}) = {pp * vp} chunks")
    return text if mtp else text.replace("m", "")


def _chunks(model: ModelSpec, pp: int, vp: int, layout: str | None) -> tuple[int, ...] | None:
    """Layers per chunk: the layout's (parse_layout leaves its 'm' out), Qwen3-235B's split with the embedding and
    the loss counted as layers, else None (an even split)."""
    if pp == 1:
        return None
    if layout is not None:
        return parse_layout(layout, pp)
    if model.name == "qwen3-235b-a22b":
        return megatron_split(model.num_layers, pp, vp, embedding=True, loss=True)
    return None


def _graphed(name: str, release: str, system: str) -> bool:
    """Full-iteration CUDA graphs: 26.06 onwards on GB200 / GB300, and Qwen3-30B on B300."""
    return release >= "26.06" and (system.startswith("GB") or (name == "qwen3-30b-a3b" and system == "B300"))


def _fp8_attention(name: str, release: str, system: str) -> bool:
    """fp8 attention (``fp8_dot_product_attention``): the full-iteration mxfp8 recipes, but DeepSeek-V3's on GB200."""
    return _graphed(name, release, system) and not (name == "deepseek-v3" and system == "GB200")


def _row(name: str, release: str, system: str, fmt: str, *cols, note: str) -> MoeRow:
    gpus, batch, mb, seq, tp, pp, cp, vp, ep, tokens, dispatcher, overlap, recompute, layout = cols
    base = MODELS[name]
    mtp = 0 if note == "no-mtp" else base.mtp_layers
    model = base if mtp == base.mtp_layers else base.model_copy(update={"mtp_layers": mtp})
    layout = _pipeline(name, pp, vp, layout, mtp)
    moe = MoeRecipe(
        dispatcher_backend="alltoall" if dispatcher == "a2a" else dispatcher,
        a2a_overlap=overlap,
        recompute_modules=_RECOMPUTE[recompute],
        pipeline_layout=layout,
        mtp_layers=mtp,
        capacity_factor=1.0 if note == "drop" else None,
    )
    dtype = "fp8" if fmt == "fp8-cs" else fmt
    training = TrainingSpec(
        seq_len=seq,
        global_batch=batch,
        dtype=dtype,
        fp8_recipe="current",
        fp8_params=dtype != "bf16",
        grad_reduce_in_fp32=False,
        moe_capacity_factor=moe.capacity_factor,
        moe_pad_to_capacity=moe.capacity_factor is not None,
        moe_flex_backend=None if dispatcher == "a2a" else dispatcher,
        cuda_graphs=_graphed(name, release, system),
        fp8_attention=_fp8_attention(name, release, system) and dtype == "mxfp8",
        # Bridge turns rope fusion off for the "yarn" position type (GPT-OSS); MLA's YaRN is a rope_type of "rope"
        rope_fusion=model.yarn is None or model.is_mla,
    )
    lay = run_layout(
        *(gpus, batch, mb, tp, pp, cp, vp),
        ep=ep,
        etp=moe.etp,
        moe_dispatcher="alltoall" if dispatcher == "a2a" else "flex",
        moe_overlap="1f1b" if overlap else "none",
        chunk_layers=_chunks(model, pp, vp, layout),
        zero=1,
        recompute_modules=moe.recompute_modules,
        tp_comm_overlap=tp > 1 and release == "25.09" and name.startswith("qwen3"),
    )
    per_domain = 64 if system.startswith("GB") and gpus % 64 == 0 else None
    step_s = tokens_to_step_time_s(batch, seq, gpus, tokens)
    source = f"Megatron-Bridge {release} performance summary"
    return MoeRow("G", model, SYSTEMS[system], gpus, training, lay, step_s, source, per_domain, moe, release, system)


def _missing(name: str, system: str) -> str | None:
    """Why a run cannot be built yet: its model or cluster is not in the catalogue."""
    if name not in MODELS:
        return f"model {name!r} is not in cost_models.catalogue.MODELS"
    if SYSTEMS[system] not in CLUSTERS:
        return f"cluster {SYSTEMS[system]!r} is not in topologies.cluster_catalogue.CLUSTERS"
    return None


@cache
def build() -> tuple[tuple[MoeRow, ...], tuple[Excluded, ...]]:
    """Every run of table G: those whose layout is valid for their model and cluster, and the
    others with the reason (the first rule ``check_layout`` names, or a missing catalogue entry)."""
    rows: list[MoeRow] = []
    excluded: list[Excluded] = []
    for name, runs in _G.items():
        for release, system, fmt, *cols, note in runs:
            what = f"{fmt} {cols[0]} GPUs GBS {cols[1]} tp{cols[4]} pp{cols[5]} vp{cols[7]} ep{cols[8]}"
            reason = _missing(name, system)
            if reason is None:
                try:
                    row = _row(name, release, system, fmt, *cols, note=note)
                    check_layout(row.layout, row.model, row.training, row.gpus, row.cluster.tp_domain_size)
                except InputError as err:
                    reason = str(err)
                else:
                    rows.append(row)
                    continue
            excluded.append(Excluded(release, system, name, what, reason))
    return tuple(rows), tuple(excluded)


def table_g() -> list[MoeRow]:
    """The runs of table G that can be costed as printed."""
    return list(build()[0])


def excluded_g() -> list[Excluded]:
    """The runs of table G left out of ``table_g``, each with its reason."""
    return list(build()[1])
