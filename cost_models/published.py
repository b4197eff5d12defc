"""Published training measurements the cost model is checked against (calibration.md, tables
A-D), each with the settings the publication left unstated, chosen once per table as the
framework's users ran them then.

Table A, Narayanan et al. SC'21 Table 1 (A100-80GB Selene, fp16, s=2048, V=51,200, full
recompute, interleaved 1F1B). Micro-batch 1 (the paper's Table 2 uses 1); virtual stages = the
largest divisor of the layers per stage that is at most 4; no distributed optimizer, no
sequence parallelism, no overlap of the DP all-reduce or of pipeline sends (neither existed in
Megatron then); no flash attention; Megatron's unfused fp32 cross entropy.

Table B, Megatron-LM README weak scaling (H100, bf16, s=4096, V=131,072, Megatron-Core
r0.8.0). Stated: DP, TP and PP overlap. Unstated, chosen as Megatron's tuned defaults: sequence
parallelism when tp > 1, no recompute, the distributed optimizer (needed by
--overlap-param-gather), gradients reduced in fp32 (Megatron-LM's default for bf16), flash
attention, its unfused cross entropy; without a pipeline one micro-batch per step (micro-batch
= global batch / DP, no gradient accumulation), with one micro-batch 1 and one layer per
virtual stage (--num-layers-per-virtual-pipeline-stage 1: the most interleaving Megatron-Core
r0.8's equal chunks allow, as throughput-tuned runs use).

Table C, NeMo 24.07 performance summary (H100, fp8). Stated: the layout columns. Unstated,
taken from NeMo's launcher configs of that release: fp8 with delayed scaling, gradients reduced
in bf16, Apex's distributed fused Adam (16-bit master-weight remainders) with overlap, sequence
parallelism when tp > 1, userbuffers TP overlap for GPT3-20B, the 70B models and Nemotron
8B/22B, no recompute except selective for
Nemotron-340B, TE's fused cross entropy, and the FlashAttention-2 package for attention (the
launcher's NVTE_FUSED_ATTN=0).

Table D, Megatron-Bridge performance summaries (H100, fp8 current scaling). Unstated, taken from
its performance recipes: fp8 primary weights (fp8_param_gather), gradients reduced in bf16,
distributed optimizer (Megatron-FSDP, ZeRO-3, where the FSDP column is set), userbuffers TP
overlap and sequence parallelism when tp > 1, no recompute, the embedding and the loss counted
as pipeline layers for 405B, and for the 70B run at GBS 256 the recipe's explicit layout
``Et*2|(t*2|)*34,t*3|(t*2|)*3,tL``.
"""

from __future__ import annotations

from cost_models.catalogue import MODELS, _gpt
from cost_models.flops import model_flops_per_step
from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from cost_models.published_dgxc import TABLE_F
from cost_models.published_moe import table_g
from cost_models.published_row import PublishedRow, recipe_chunks, run_layout  # re-exported: the tables' rows
from cost_models.published_runs import TABLE_E
from cost_models.training import TrainingSpec


def _vpp(layers_per_stage: int, pp: int, most: int = 4) -> int:
    return max(v for v in range(1, most + 1) if layers_per_stage % v == 0) if pp > 1 else 1


def _from_tflops(model: ModelSpec, seq: int, batch: int, gpus: int, tflops: float, recompute: bool) -> float:
    """Iteration time implied by TFLOP/s per GPU. Table A counts the recompute forward (96 B L s
    h^2 (...) = 4/3 of model FLOPs, minus the logits' share); table B counts model FLOPs only."""
    flops = model_flops_per_step(model, seq, batch)
    if recompute:
        h, L, V = model.hidden_size, model.num_layers, model.vocab_size
        flops = 96 * batch * L * seq * h * h * (1 + seq / (6 * h) + V / (16 * h * L))
    return flops / (gpus * tflops * 1e12)


def _from_tokens(seq: int, batch: int, gpus: int, tokens_per_s_per_gpu: float) -> float:
    return batch * seq / (tokens_per_s_per_gpu * gpus)


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


def _row_a(name: str, tp: int, pp: int, gpus: int, batch: int, tflops: float) -> PublishedRow:
    model = MODELS[name]
    training = TrainingSpec(
        seq_len=2048, global_batch=batch, dtype="fp16", flash_attention=False, fused_cross_entropy=False
    )
    layout = ParallelLayout(
        tp=tp,
        pp=pp,
        dp=gpus // (tp * pp),
        micro_batch=1,
        global_batch=batch,
        vpp=_vpp(model.num_layers // pp, pp),
        recompute="full",
        overlap_grad_reduce=False,
        overlap_p2p=False,
        p2p_scatter_gather=True,
    )
    time_s = _from_tflops(model, 2048, batch, gpus, tflops, recompute=True)
    return PublishedRow("A", model, "dgx-a100", gpus, training, layout, time_s, "Narayanan et al. SC'21, Table 1")


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


def _row_b(name, heads, hidden, layers, tp, pp, gpus, batch, tflops) -> PublishedRow:
    model = _gpt(f"megatron-h100-{name}", hidden, layers, heads, vocab_size=131072, max_position_embeddings=4096)
    training = TrainingSpec(seq_len=4096, global_batch=batch, dtype="bf16", fused_cross_entropy=False)
    dp = gpus // (tp * pp)
    layout = ParallelLayout(
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batch=1 if pp > 1 else batch // dp,
        global_batch=batch,
        vpp=layers // pp if pp > 1 else 1,
        sequence_parallel=tp > 1,
        zero=1,
        tp_comm_overlap=True,
    )
    time_s = _from_tflops(model, 4096, batch, gpus, tflops, recompute=False)
    return PublishedRow("B", model, "dgx-h100", gpus, training, layout, time_s, "Megatron-LM README (core r0.8.0)")


# Strong scaling of the 177B model at global batch 1152 (Megatron-LM README plot, +-2%): GPUs,
# TFLOP/s per GPU. Layout as its weak-scaling row (TP8 PP6), DP = GPUs / 48.
_B_STRONG = [(96, 464), (144, 464), (288, 461), (576, 458), (1152, 450), (2304, 437), (3072, 427), (4608, 416)]


def _row_b_strong(gpus: int, tflops: float) -> PublishedRow:
    row = _row_b("177b", 96, 12288, 96, 8, 6, gpus, 1152, tflops)
    return PublishedRow(
        "B-strong",
        row.model,
        row.cluster_name,
        gpus,
        row.training,
        row.layout,
        row.measured_step_time_s,
        "Megatron-LM README strong-scaling plot (core r0.8.0)",
    )


_C = [  # model, GPUs, GBS, MBS, seq, TP, PP, CP, VP, tokens/s/GPU
    ("gpt3-5b", 64, 2048, 4, 2048, 1, 1, 1, 1, 22521),
    ("gpt3-20b", 64, 256, 2, 2048, 2, 1, 1, 1, 5851),
    ("gpt3-175b", 128, 256, 1, 2048, 4, 8, 1, 6, 726),
    ("gpt3-175b", 512, 2048, 2, 2048, 4, 8, 1, 6, 782),
    ("llama2-7b", 8, 128, 1, 4096, 1, 1, 1, 1, 16847),
    ("llama2-13b", 16, 128, 1, 4096, 1, 4, 1, 10, 8646),
    ("llama2-70b", 64, 128, 1, 4096, 4, 4, 1, 20, 1707),
    ("nemotron-8b", 64, 256, 4, 4096, 2, 1, 1, 1, 12701),
    ("nemotron-22b", 64, 256, 2, 4096, 2, 4, 1, 10, 4256),
    ("nemotron-340b", 128, 32, 1, 4096, 8, 8, 1, 12, 322),
    ("llama3-8b", 8, 128, 1, 8192, 1, 1, 2, 1, 12036),
    ("llama3-70b", 64, 128, 1, 8192, 4, 4, 2, 5, 1533),
]
_C_TP_OVERLAP = {"gpt3-20b", "llama2-70b", "llama3-70b", "nemotron-8b", "nemotron-22b"}


def _row_c(name, gpus, batch, mb, seq, tp, pp, cp, vp, tokens) -> PublishedRow:
    model = MODELS[name]
    training = TrainingSpec(
        seq_len=seq,
        global_batch=batch,
        dtype="fp8",
        fp8_recipe="delayed",
        grad_reduce_in_fp32=False,
        precision_aware_optimizer=True,
        attention_kernel="flash2",
    )
    layout = run_layout(
        *(gpus, batch, mb, tp, pp, cp, vp),
        recompute="selective" if name == "nemotron-340b" else "none",
        zero=1,
        tp_comm_overlap=name in _C_TP_OVERLAP,
    )
    time_s = _from_tokens(seq, batch, gpus, tokens)
    return PublishedRow("C", model, "dgx-h100", gpus, training, layout, time_s, "NeMo 24.07 performance summary")


_D = [  # release, model, GPUs, GBS, MBS, seq, FSDP, TP, PP, CP, VP, tokens/s/GPU
    ("25.11", "llama3-8b", 8, 128, 1, 8192, 8, 1, 1, 1, 1, 14451),
    ("25.11", "llama3-70b", 64, 128, 1, 8192, 0, 4, 8, 1, 5, 1602),
    ("25.11", "llama3.1-405b", 1024, 512, 1, 8192, 0, 8, 8, 2, 8, 292),
    ("26.04.01", "llama3-70b", 64, 256, 1, 8192, 0, 4, 8, 1, 5, 1664),
    ("26.06", "llama3.1-405b", 1024, 1536, 1, 8192, 0, 8, 8, 2, 8, 326),
]


def _row_d(release, name, gpus, batch, mb, seq, fsdp, tp, pp, cp, vp, tokens) -> PublishedRow:
    model = MODELS[name]
    training = TrainingSpec(
        seq_len=seq, global_batch=batch, dtype="fp8", fp8_recipe="current", fp8_params=True, grad_reduce_in_fp32=False
    )
    chunks = recipe_chunks(name, "H100", pp, vp, batch)
    layout = run_layout(
        gpus, batch, mb, tp, pp, cp, vp, chunk_layers=chunks, zero=3 if fsdp else 1, tp_comm_overlap=tp > 1
    )
    time_s = _from_tokens(seq, batch, gpus, tokens)
    source = f"Megatron-Bridge performance summary {release}"
    return PublishedRow("D", model, "dgx-h100", gpus, training, layout, time_s, source)


TABLE_A = [_row_a(*r) for r in _A]
TABLE_B = [_row_b(*r) for r in _B]
TABLE_B_STRONG = [_row_b_strong(*r) for r in _B_STRONG]
TABLE_C = [_row_c(*r) for r in _C]
TABLE_D = [_row_d(*r) for r in _D]
TABLES = {"A": TABLE_A, "B": TABLE_B, "B-strong": TABLE_B_STRONG, "C": TABLE_C, "D": TABLE_D}


def all_tables() -> dict[str, list[PublishedRow]]:
    """Tables A-D of calibration.md, table E (``published_runs``), table F (``published_dgxc``) and
    table G (``published_moe``, the MoE runs whose layout is valid as printed)."""
    return {**TABLES, "E": TABLE_E, "F": TABLE_F, "G": table_g()}
