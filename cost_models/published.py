"""Published training measurements the cost model is checked against (calibration.md).

Table A: Narayanan et al. SC'21 Table 1 (A100-80GB Selene, fp16, s=2048, V=51,200, full
recompute, interleaved 1F1B). Unstated settings, chosen as Megatron users did in 2021:
micro-batch 1 (the paper's Table 2 uses 1); virtual stages = the largest divisor of the layers
per stage that is at most 4; no distributed optimizer, no sequence parallelism, no overlap of
the DP all-reduce or pipeline sends (neither existed in Megatron then); no flash attention.

Table B: Megatron-LM README weak scaling (H100, bf16, s=4096, V=131,072, Megatron-Core
r0.8.0). Stated: DP, TP and PP overlap. Unstated, chosen as Megatron's tuned defaults: micro-
batch 1, sequence parallel when tp > 1, no recompute, distributed optimizer (needed by
--overlap-param-gather), flash attention, the same virtual-stage rule as table A.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.catalogue import MODELS, _gpt
from cost_models.flops import model_flops_per_step
from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster
from topologies.clusters import CLUSTERS


@dataclass(frozen=True)
class PublishedRow:
    table: str
    model: ModelSpec
    tp: int
    pp: int
    gpus: int
    global_batch: int
    tflops_per_gpu: float  # as published
    seq_len: int

    @property
    def cluster(self) -> Cluster:
        return Cluster(spec=CLUSTERS["dgx-a100" if self.table == "A" else "dgx-h100"], num_gpus=self.gpus)

    @property
    def training(self) -> TrainingSpec:
        return TrainingSpec(
            seq_len=self.seq_len,
            global_batch=self.global_batch,
            dtype="fp16" if self.table == "A" else "bf16",
            distributed_optimizer=self.table == "B",
            flash_attention=self.table == "B",
        )

    @property
    def layout(self) -> ParallelLayout:
        per_stage = self.model.num_layers // self.pp
        vpp = max(v for v in (1, 2, 3, 4) if per_stage % v == 0) if self.pp > 1 else 1
        a = self.table == "A"
        return ParallelLayout(
            tp=self.tp,
            pp=self.pp,
            dp=self.gpus // (self.tp * self.pp),
            micro_batch=1,
            global_batch=self.global_batch,
            vpp=vpp,
            recompute="full" if a else "none",
            sequence_parallel=not a and self.tp > 1,
            distributed_optimizer=not a,
            overlap_grad_reduce=not a,
            overlap_p2p=not a,
            tp_comm_overlap=not a,
        )

    @property
    def measured_step_time_s(self) -> float:
        """Iteration time implied by the published TFLOP/s. Table A counts the recompute
        forward (96 B L s h^2 (...) = 4/3 of model FLOPs, minus the logits' share); table B
        counts model FLOPs only."""
        flops = model_flops_per_step(self.model, self.seq_len, self.global_batch)
        if self.table == "A":
            m = self.model
            h, L, s, V = m.hidden_size, m.num_layers, self.seq_len, m.vocab_size
            flops = 96 * self.global_batch * L * s * h * h * (1 + s / (6 * h) + V / (16 * h * L))
        return flops / (self.gpus * self.tflops_per_gpu * 1e12)


_A = [  # name, TP, PP, GPUs, global batch, TFLOP/s per GPU
    ("megatron-1.7b", 1, 1, 32, 512, 137),
    ("megatron-3.6b", 2, 1, 64, 512, 138),
    ("megatron-7.5b", 4, 1, 128, 512, 142),
    ("megatron-18.4b", 8, 1, 256, 1024, 135),
    ("megatron-39.1b", 8, 2, 512, 1536, 138),
    ("megatron-76.1b", 8, 4, 1024, 1792, 140),
    ("megatron-145.6b", 8, 8, 1536, 2304, 148),
    ("megatron-310.1b", 8, 16, 1920, 2160, 155),
    ("megatron-529.6b", 8, 35, 2520, 2520, 163),
    ("megatron-1t", 8, 64, 3072, 3072, 163),
]
_B = [  # params, heads, hidden, layers, TP, PP, GPUs, global batch, TFLOP/s per GPU
    ("1.7b", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    ("7.1b", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    ("16b", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    ("32b", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    ("70b", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    ("119b", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    ("177b", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    ("314b", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    ("462b", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
]

TABLE_A = [PublishedRow("A", MODELS[n], tp, pp, g, b, f, 2048) for n, tp, pp, g, b, f in _A]
TABLE_B = [
    PublishedRow(
        "B", _gpt(f"megatron-h100-{n}", h, L, a, vocab_size=131072, max_position_embeddings=4096), tp, pp, g, b, f, 4096
    )
    for n, a, h, L, tp, pp, g, b, f in _B
]
