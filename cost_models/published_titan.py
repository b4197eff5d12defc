"""Table H: every run torchtitan publishes with its layout and a measured throughput, from
pytorch/torchtitan's ``benchmarks/`` (snapshot b5bcd76, 2026-08-21; ``docs/performance.md``
before commit 820504e moved its December 2024 tables there unchanged):

- ``llama3_h100_202412_torchtitan.md`` (tables 1-6; torch 1963fc8, torchao eab345c,
  torchtitan 9dec370, December 2024): tokens/s/GPU and peak memory.
- ``asyncTP_llama3_h100_2025-06_torchtitan.md`` (torchtitan 820504e, June 2025): tokens/s/GPU
  only, vanilla and async TP, bf16 and float8 tensorwise / rowwise.
- ``llama3-8b_h200_202506_trainy-whitefiber.md`` (torchtitan e7c0cae, June 2025): tokens/s/GPU
  and memory.

Left out: ``docs/performance.md``'s 2024 tables (Llama 2 and 3 on A100, 405B on H100), which
state neither peak memory nor, for 405B, the layout beyond the FSDP degree.

torchtitan's tokens/s/GPU is the tokens of a rank's local batch (the whole sequences, before the
context-parallel split) per second over tp x pp x cp (``train.py``'s
``parallel_dims.non_data_parallel_size``): step time = local batch x seq / (tps x tp x pp x cp).
Memory is ``torch.cuda.max_memory_reserved`` (the caching allocator's reserve), the largest over
ranks. Every one of the 20 figures is a peak (``TitanRow.memory_is_peak``): torchtitan's metrics
log the peak since the previous log and reset it, the December 2024 source takes the maximum over
ranks ("stable across the whole training process"), and the Trainy H200 figures, "arbitrarily
sampled at the 100th iteration", are that logged peak at step 100 (reserved or active: the source
does not say, its WandB report logs both). Their 35-39% over-prediction before issue 25's second
round was the loss, not the measure: at e7c0cae ``--training.compile`` compiles the loss too
(``TitanSettings.compile_loss``), which December 2024's train.py left eager.

Settings the sources leave unstated, chosen once from torchtitan's defaults at the commit run:

- Sequence length 8,192 (the model's ``train_configs/llama3_*.toml``) where no table gives one.
- FSDP2 mixed precision: bf16 parameters gathered, gradients reduce-scattered in fp32
  (``mixed_precision_reduce = float32``); ``reshard_after_forward`` on without pipelining, off
  with it (torchtitan's default policy); one FSDP unit per transformer block, plus the
  embedding and the final norm + LM head.
- Pipelining: as many micro-batches as stages (``pipeline_parallel_microbatches`` None ->
  ``pipeline_parallel_degree``), interleaved 1F1B with two stages per rank.
- Context parallelism: the default ``context_parallel_rotate_method = allgather`` (keys and
  values all-gathered once per attention layer), load-balanced causal sharding.
- "selective" AC is torchtitan's per-op policy (``selective_ac_option = op``); float8 without
  a stated recipe is tensorwise dynamic scaling; float8 FSDP all-gathers as the model's toml
  sets them (405B on, 8B and 70B off; the Trainy run's command line on).
- The Grand Teton H100s are HBM2e parts (96 GB, 2.4 TB/s, 500 W; the sources' hardware
  section): ``GRAND_TETON``, the catalogue's H100-SXM with those three figures and its tensor
  peaks times ``GRAND_TETON_CLOCK``. The source's footnote puts their peak "between SXM and NVL"
  (0.845 to 1 of the SXM's dense bf16 TFLOP/s) but does not give it: 0.85 is FITTED within that
  range (a 0.05-grid search beside TitanSettings.attention_factor; benchmarks/fit_titan.py's least
  squares gives 0.844, the NVL end) and counts as one of table H's fitted constants.
- SDPA's flash backend (FlashAttention-2) runs attention: ``TrainingSpec.attention_kernel`` flash2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.titan import TitanSettings
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS, ClusterSpec
from topologies.gpus import GIB, GPUS

ATTENTION_KERNEL = "flash2"  # PyTorch SDPA's flash backend (FlashAttention-2), which torchtitan's SDPA runs
_GT = "benchmarks/llama3_h100_202412_torchtitan.md (= docs/performance.md before 820504e), torchtitan 9dec370"
_ATP = "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, torchtitan 820504e"
_TRAINY = "benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md, torchtitan e7c0cae"
_MODELS = {"8b": "llama3-8b", "70b": "llama3-70b", "405b": "llama3.1-405b"}

GRAND_TETON_CLOCK = 0.85  # FITTED: peak of the 500 W HBM2e H100 over the SXM's, see the module's docstring


def grand_teton(clock: float = GRAND_TETON_CLOCK) -> ClusterSpec:
    """The Grand Teton H100 host with its tensor peaks at ``clock`` times the H100-SXM's."""
    sxm = GPUS["H100-SXM"]
    gpu = sxm.model_copy(
        update={
            "name": "H100-HBM2e-500W",
            "hbm_bytes": 96 * GIB,
            "hbm_bw_bytes_per_s": 2.4e12,
            "tdp_watts": 500,
            "bf16_flops_per_s": sxm.bf16_flops_per_s * clock,
            "fp8_flops_per_s": sxm.fp8_flops_per_s * clock,
        }
    )
    return CLUSTERS["dgx-h100"].model_copy(update={"name": "grand-teton-h100", "gpu": gpu.name, "custom_gpu": gpu})


GRAND_TETON = grand_teton()


@dataclass(frozen=True)
class TitanRow:
    """One published torchtitan run."""

    source: str
    label: str  # the source's table and row
    model_name: str
    system: str  # "grand-teton" or a catalogue cluster
    gpus: int
    fsdp: int
    tp: int
    pp: int
    cp: int
    local_batch: int
    seq_len: int
    ac: str  # "selective" (per-op SAC) or "full"
    tokens_per_s_per_gpu: float
    memory_gib: float | None
    titan: TitanSettings = field(default_factory=TitanSettings)
    float8: str | None = None  # None (bf16), "tensorwise" or "rowwise"
    vpp: int = 1
    async_tp: bool = False

    @property
    def memory_is_peak(self) -> bool:
        """Whether the run states a memory figure that is a peak the cost model predicts."""
        return self.memory_gib is not None

    @property
    def model(self):
        return MODELS[self.model_name]

    @property
    def measured_step_time_s(self) -> float:
        return self.local_batch * self.seq_len / (self.tokens_per_s_per_gpu * self.tp * self.pp * self.cp)

    @cached_property
    def cluster(self) -> Cluster:
        return self.cluster_at(GRAND_TETON_CLOCK)

    def cluster_at(self, clock: float) -> Cluster:
        """The run's cluster with the Grand Teton H100s at ``clock`` times the SXM's peak (other
        systems as catalogued): what benchmarks/fit_titan.py varies."""
        spec = grand_teton(clock) if self.system == "grand-teton" else CLUSTERS[self.system]
        return Cluster(spec=spec, num_gpus=self.gpus)

    @property
    def training(self) -> TrainingSpec:
        fp8 = self.float8 is not None
        return TrainingSpec(
            seq_len=self.seq_len,
            global_batch=self.local_batch * self.fsdp,
            dtype="fp8" if fp8 else "bf16",
            fp8_recipe="current",
            fp8_params=fp8 and self.titan.fsdp_float8_all_gather,
            grad_reduce_in_fp32=True,
            attention_kernel=ATTENTION_KERNEL,
        )

    @property
    def layout(self) -> ParallelLayout:
        micro = self.local_batch // self.pp if self.pp > 1 else self.local_batch
        return ParallelLayout(
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            dp=self.fsdp,
            micro_batch=micro,
            global_batch=self.local_batch * self.fsdp,
            vpp=self.vpp,
            sequence_parallel=self.tp > 1,
            recompute="full" if self.ac == "full" else "selective",
            zero=3,
            reshard_after_forward=self.pp == 1,
            tp_comm_overlap=self.async_tp,
        )


def _row(
    source, label, model, system, gpus, fsdp, tp, pp, cp, lb, seq, ac, tps, mem, f8=None, vpp=1, async_tp=False, **titan
):
    titan["float8_scaling"] = "rowwise" if f8 == "rowwise" else "tensorwise"
    titan["compile_loss"] = source != _GT  # December 2024's train.py left the loss eager
    return TitanRow(
        source, label, _MODELS[model], system, gpus, fsdp, tp, pp, cp, lb, seq, ac, tps, mem,
        TitanSettings(**titan), f8, vpp, async_tp,
    )  # fmt: skip


_TW = "tensorwise"
_GTN = "grand-teton"
_ON = {"fsdp_float8_all_gather": True}
# fmt: off
TABLE_H: list[TitanRow] = [
    # source, label, model, system, GPUs, FSDP, TP, PP, CP, local batch, seq, AC, tokens/s/GPU, GiB, float8
    _row(_GT, "T1 FSDP", "8b", _GTN, 8, 8, 1, 1, 1, 2, 8192, "selective", 5762, 82.4, compile=False),
    _row(_GT, "T1 +compile", "8b", _GTN, 8, 8, 1, 1, 1, 2, 8192, "selective", 6667, 77.0),
    _row(_GT, "T1 +compile+fp8", "8b", _GTN, 8, 8, 1, 1, 1, 2, 8192, "selective", 8532, 76.8, _TW),
    _row(_GT, "T2 CP1 32k", "8b", _GTN, 8, 8, 1, 1, 1, 1, 32768, "full", 3890, 83.9, _TW),
    _row(_GT, "T2 CP2 64k", "8b", _GTN, 8, 4, 1, 1, 2, 1, 65536, "full", 2540, 84.2, _TW),
    _row(_GT, "T2 CP4 128k", "8b", _GTN, 8, 2, 1, 1, 4, 1, 131072, "full", 1071, 84.0, _TW),
    _row(_GT, "T2 CP8 256k", "8b", _GTN, 8, 1, 1, 1, 8, 1, 262144, "full", 548, 84.5, _TW),
    _row(_GT, "T3 FSDP", "8b", _GTN, 128, 128, 1, 1, 1, 2, 8192, "selective", 5605, 67.0, compile=False),
    _row(_GT, "T3 +compile", "8b", _GTN, 128, 128, 1, 1, 1, 2, 8192, "selective", 6514, 62.0),
    _row(_GT, "T3 +compile+fp8", "8b", _GTN, 128, 128, 1, 1, 1, 2, 8192, "selective", 8380, 61.8, _TW),
    _row(_GT, "T4 2D", "70b", _GTN, 256, 32, 8, 1, 1, 16, 8192, "full", 829, 71.9, _TW),
    _row(_GT, "T4 2D+asyncTP", "70b", _GTN, 256, 32, 8, 1, 1, 16, 8192, "full", 876, 67.6, _TW, async_tp=True),
    _row(_GT, "T5 1F1B", "405b", _GTN, 512, 8, 8, 8, 1, 32, 8192, "full", 100, 82.5, _TW, async_tp=True, **_ON),
    _row(_GT, "T5 interleaved", "405b", _GTN, 512, 8, 8, 8, 1, 32, 8192, "full", 128, 72.7, _TW, 2,
         async_tp=True, **_ON),
    _row(_GT, "T6 CP1 32k", "405b", _GTN, 512, 8, 8, 8, 1, 8, 32768, "full", 76, 75.3, _TW, async_tp=True, **_ON),
    _row(_GT, "T6 CP2 64k", "405b", _GTN, 512, 4, 8, 8, 2, 8, 65536, "full", 47, 75.9, _TW, async_tp=True, **_ON),
    _row(_GT, "T6 CP4 128k", "405b", _GTN, 512, 2, 8, 8, 4, 8, 131072, "full", 31, 77.1, _TW, async_tp=True, **_ON),
    _row(_GT, "T6 CP8 256k", "405b", _GTN, 512, 1, 8, 8, 8, 8, 262144, "full", 16, 84.9, _TW, async_tp=True, **_ON),
    _row(_ATP, "70B bf16", "70b", _GTN, 256, 32, 8, 1, 1, 16, 8192, "full", 597.3, None),
    _row(_ATP, "70B bf16 asyncTP", "70b", _GTN, 256, 32, 8, 1, 1, 16, 8192, "full", 652.4, None, async_tp=True),
    _row(_ATP, "70B fp8-tw", "70b", _GTN, 256, 32, 8, 1, 1, 16, 8192, "full", 809.8, None, _TW),
    _row(_ATP, "70B fp8-tw asyncTP", "70b", _GTN, 256, 32, 8, 1, 1, 16, 8192, "full", 942.4, None, _TW, async_tp=True),
    _row(_ATP, "70B fp8-rw", "70b", _GTN, 256, 32, 8, 1, 1, 16, 8192, "full", 599.6, None, "rowwise"),
    _row(_ATP, "70B fp8-rw asyncTP", "70b", _GTN, 256, 32, 8, 1, 1, 16, 8192, "full", 624.8, None, "rowwise",
         async_tp=True),
    _row(_ATP, "8B bf16", "8b", _GTN, 64, 8, 8, 1, 1, 12, 8192, "selective", 4378, None),
    _row(_ATP, "8B bf16 asyncTP", "8b", _GTN, 64, 8, 8, 1, 1, 12, 8192, "selective", 4809.4, None, async_tp=True),
    _row(_ATP, "8B fp8-tw", "8b", _GTN, 64, 8, 8, 1, 1, 12, 8192, "selective", 5078.1, None, _TW),
    _row(_ATP, "8B fp8-tw asyncTP", "8b", _GTN, 64, 8, 8, 1, 1, 12, 8192, "selective", 5570.1, None, _TW,
         async_tp=True),
    _row(_ATP, "8B fp8-rw", "8b", _GTN, 64, 8, 8, 1, 1, 12, 8192, "selective", 3708.5, None, "rowwise"),
    _row(_ATP, "8B fp8-rw asyncTP", "8b", _GTN, 64, 8, 8, 1, 1, 12, 8192, "selective", 3914.9, None, "rowwise",
         async_tp=True),
    _row(_TRAINY, "H200 4 nodes", "8b", "hgx-h200", 32, 32, 1, 1, 1, 2, 8192, "selective", 10938, 47.96, _TW, **_ON),
    _row(_TRAINY, "H200 8 nodes", "8b", "hgx-h200", 64, 64, 1, 1, 1, 2, 8192, "selective", 10753, 46.97, _TW, **_ON),
]
# fmt: on
