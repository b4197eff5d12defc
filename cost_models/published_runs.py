"""Table E: more published runs, not in calibration.md: every dense pre-training run of NVIDIA's
NeMo and Megatron-Bridge performance summaries on H100, B200 and GB200 that states its full
layout (collected from the documents' git history: NeMo ``docs/source/performance/`` and
Megatron-Bridge ``docs/performance-summary*.md``). Runs already in tables C and D, Blackwell
runs that offload activations to the CPU (not modelled), two long-sequence B200 rows whose
GPU counts changed between versions of their page without their layout changing, and the 25.09
GB200 70B mxfp8 alternative, which shares the micro-batch cell (2) of an FSDP run and would need
about 230 GB per GPU as printed, are left out.

Settings the summaries do not print, per era, from the frameworks' performance recipes of that
release:

- NeMo 24.03 (H100, fp8, long sequences): as table C (delayed scaling, gradients reduced in bf16,
  Apex's distributed fused Adam, FlashAttention-2), userbuffers TP overlap when tp > 1.
- NeMo 25.04 (B200, fp8, long sequences) and Megatron-Bridge 25.09-26.06: fp8 with current
  (tensorwise) scaling, or mxfp8 / nvfp4 as stated, fp8 primary weights (fp8_param_gather;
  nvfp4 from 26.04), gradients reduced in bf16, Megatron's distributed optimizer (Megatron-FSDP,
  ZeRO-3, where the FSDP column is set), cuDNN attention, userbuffers TP overlap when tp > 1
  except with nvfp4, no recompute, the embedding and the loss counted as pipeline layers for
  405B, and for 70B on H100 at GBS 256 the recipe's layout ``Et*2|(t*2|)*34,t*3|(t*2|)*3,tL``.
- GB200 runs on 64 GPUs use 64 of each NVL72 rack.

Attention FLOPs: NeMo up to 25.07 counts them in full, Megatron-Bridge causally; rows quoting only
TFLOP/s are converted with their own convention.
"""

from __future__ import annotations

from cost_models.catalogue import MODELS
from cost_models.flops import model_flops_per_step
from cost_models.published_row import PublishedRow, recipe_chunks, run_layout
from cost_models.training import TrainingSpec

_SYSTEMS = {"H100": "dgx-h100", "B200": "dgx-b200", "GB200": "gb200-nvl72"}
_E = [  # release, system, model, format, GPUs, GBS, MBS, seq, FSDP, TP, PP, CP, VP, measured as, value
    ("24.03.01", "H100", "llama2-7b", "fp8", 8, 512, 1, 8192, 0, 1, 2, 1, 1, "tflops", 730),
    ("24.03.01", "H100", "llama2-7b", "fp8", 16, 256, 1, 16384, 0, 2, 1, 1, 1, "tflops", 660),
    ("24.03.01", "H100", "llama2-7b", "fp8", 32, 128, 1, 32768, 0, 2, 1, 2, 1, "tflops", 610),
    ("24.03.01", "H100", "llama2-7b", "fp8", 64, 64, 1, 65536, 0, 4, 1, 2, 1, "tflops", 574),
    ("24.03.01", "H100", "llama2-7b", "fp8", 128, 32, 1, 131072, 0, 4, 1, 4, 1, "tflops", 555),
    ("24.03.01", "H100", "llama2-7b", "fp8", 256, 16, 1, 262144, 0, 4, 1, 8, 1, "tflops", 549),
    ("24.03.01", "H100", "llama2-7b", "fp8", 512, 8, 1, 524288, 0, 8, 1, 16, 1, "tflops", 549),
    ("24.03.01", "H100", "llama2-7b", "fp8", 1024, 4, 1, 1048576, 0, 8, 1, 32, 1, "tflops", 536),
    ("25.04.rc2", "B200", "llama3-8b", "fp8-cs", 8, 512, 1, 8192, 0, 1, 1, 1, 1, "tflops", 1671),
    ("25.04.rc2", "B200", "llama3-8b", "fp8-cs", 16, 256, 1, 16384, 0, 1, 1, 1, 1, "tflops", 1717),
    ("25.04.rc2", "B200", "llama3-8b", "fp8-cs", 32, 128, 1, 32768, 0, 1, 1, 2, 1, "tflops", 1624),
    ("25.04.rc2", "B200", "llama3-8b", "fp8-cs", 64, 64, 1, 65536, 0, 1, 1, 4, 1, "tflops", 1600),
    ("25.04.rc2", "B200", "llama3-8b", "fp8-cs", 128, 32, 1, 131072, 0, 2, 1, 4, 1, "tflops", 1588),
    ("25.04.rc2", "B200", "llama3-8b", "fp8-cs", 256, 16, 1, 262144, 0, 4, 1, 4, 1, "tflops", 1590),
    ("25.09", "B200", "llama3.1-405b", "fp8-cs", 128, 64, 1, 8192, 0, 4, 8, 2, 8, "tokens", 664),
    ("25.09", "B200", "llama3.1-405b", "mxfp8", 128, 64, 1, 8192, 0, 4, 8, 2, 8, "tokens", 622),
    ("25.09", "B200", "llama3-8b", "fp8-cs", 8, 128, 2, 8192, 0, 1, 1, 1, 1, "tokens", 29994),
    ("25.09", "B200", "llama3-8b", "mxfp8", 8, 128, 2, 8192, 0, 1, 1, 1, 1, "tokens", 29388),
    ("25.09", "GB200", "llama3.1-405b", "mxfp8", 128, 64, 1, 8192, 0, 4, 8, 2, 8, "tokens", 578),
    ("25.09", "GB200", "llama3-8b", "fp8-cs", 8, 128, 2, 8192, 0, 1, 1, 1, 1, "tokens", 31357),
    ("25.09", "GB200", "llama3-8b", "mxfp8", 8, 128, 2, 8192, 0, 1, 1, 1, 1, "tokens", 29925),
    ("25.09", "H100", "llama3.1-405b", "fp8-cs", 1024, 512, 1, 8192, 0, 8, 8, 2, 8, "tokens", 302),
    ("25.09", "H100", "llama3-70b", "fp8-cs", 64, 128, 1, 8192, 0, 4, 8, 1, 5, "tokens", 1619),
    ("25.09", "H100", "llama3-8b", "fp8-cs", 8, 128, 1, 8192, 8, 1, 1, 1, 1, "tokens", 14079),
    ("25.11", "B200", "llama3.1-405b", "fp8-cs", 128, 64, 1, 8192, 0, 4, 8, 2, 8, "tokens", 661),
    ("25.11", "B200", "llama3.1-405b", "mxfp8", 128, 64, 1, 8192, 0, 4, 8, 2, 8, "tokens", 624),
    ("25.11", "B200", "llama3-8b", "fp8-cs", 8, 128, 2, 8192, 0, 1, 1, 1, 1, "tokens", 30624),
    ("25.11", "B200", "llama3-8b", "mxfp8", 8, 128, 2, 8192, 0, 1, 1, 1, 1, "tokens", 29521),
    ("25.11", "GB200", "llama3.1-405b", "fp8-cs", 256, 1536, 1, 8192, 0, 4, 16, 1, 4, "tokens", 813),
    ("25.11", "GB200", "llama3-8b", "fp8-cs", 8, 128, 2, 8192, 0, 1, 1, 1, 1, "tokens", 31508),
    ("25.11", "GB200", "llama3-8b", "mxfp8", 8, 128, 2, 8192, 0, 1, 1, 1, 1, "tokens", 29789),
    ("26.02", "GB200", "llama3.1-405b", "fp8-cs", 256, 1536, 1, 8192, 0, 4, 16, 1, 4, "tokens", 793),
    ("26.02", "GB200", "llama3.1-405b", "mxfp8", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 786),
    ("26.02", "GB200", "llama3.1-405b", "nvfp4", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 1076),
    ("26.02", "GB200", "llama3-70b", "mxfp8", 64, 256, 1, 8192, 0, 2, 4, 1, 5, "tokens", 3613),
    ("26.02", "GB200", "llama3-70b", "nvfp4", 64, 256, 1, 8192, 0, 2, 4, 1, 5, "tokens", 4458),
    ("26.02", "H100", "llama3.1-405b", "fp8-cs", 1024, 1536, 1, 8192, 0, 8, 8, 2, 8, "tokens", 311),
    ("26.02", "H100", "llama3-70b", "fp8-cs", 64, 256, 1, 8192, 0, 4, 8, 1, 5, "tokens", 1621),
    ("26.02.01", "GB200", "llama3.1-405b", "fp8-cs", 256, 1536, 1, 8192, 0, 4, 16, 1, 4, "tokens", 818),
    ("26.02.01", "GB200", "llama3.1-405b", "mxfp8", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 775),
    ("26.02.01", "GB200", "llama3.1-405b", "nvfp4", 256, 1536, 1, 8192, 0, 4, 16, 1, 4, "tokens", 1083),
    ("26.02.01", "GB200", "llama3-70b", "mxfp8", 64, 256, 1, 8192, 0, 2, 4, 1, 5, "tokens", 3837),
    ("26.02.01", "GB200", "llama3-70b", "nvfp4", 64, 256, 1, 8192, 0, 2, 4, 1, 5, "tokens", 4557),
    ("26.02.01", "H100", "llama3-70b", "fp8-cs", 64, 256, 1, 8192, 0, 4, 8, 1, 5, "tokens", 1639),
    ("26.04", "GB200", "llama3.1-405b", "fp8-cs", 256, 1536, 1, 8192, 0, 4, 16, 1, 4, "tokens", 842),
    ("26.04", "GB200", "llama3.1-405b", "mxfp8", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 793),
    ("26.04", "GB200", "llama3.1-405b", "nvfp4", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 1136),
    ("26.04", "GB200", "llama3-70b", "mxfp8", 64, 256, 1, 8192, 0, 2, 4, 1, 5, "tokens", 3828),
    ("26.04", "GB200", "llama3-70b", "nvfp4", 64, 256, 1, 8192, 0, 2, 4, 1, 5, "tokens", 4898),
    ("26.04", "H100", "llama3-70b", "fp8-cs", 64, 256, 1, 8192, 0, 4, 8, 1, 5, "tokens", 1633),
    ("26.04.01", "GB200", "llama3.1-405b", "fp8-cs", 256, 1536, 1, 8192, 0, 4, 16, 1, 4, "tokens", 864),
    ("26.04.01", "GB200", "llama3.1-405b", "mxfp8", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 800),
    ("26.04.01", "GB200", "llama3.1-405b", "nvfp4", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 1184),
    ("26.04.01", "GB200", "llama3-70b", "mxfp8", 64, 256, 1, 8192, 0, 2, 4, 1, 5, "tokens", 3712),
    ("26.04.01", "GB200", "llama3-70b", "nvfp4", 64, 256, 1, 8192, 0, 2, 4, 1, 5, "tokens", 4864),
    ("26.04.01", "H100", "llama3.1-405b", "fp8-cs", 1024, 1536, 1, 8192, 0, 8, 8, 2, 8, "tokens", 328),
    ("26.06", "GB200", "llama3.1-405b", "fp8-cs", 256, 1536, 1, 8192, 0, 4, 16, 1, 4, "tokens", 843),
    ("26.06", "GB200", "llama3.1-405b", "mxfp8", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 783),
    ("26.06", "GB200", "llama3.1-405b", "nvfp4", 256, 1536, 1, 8192, 0, 4, 16, 1, 8, "tokens", 1166),
]


def _row_e(release, system, name, fmt, gpus, batch, mb, seq, fsdp, tp, pp, cp, vp, kind, value) -> PublishedRow:
    model = MODELS[name]
    nemo1 = release.startswith("24.")
    dtype = "fp8" if fmt in ("fp8", "fp8-cs") else fmt
    training = TrainingSpec(
        seq_len=seq,
        global_batch=batch,
        dtype=dtype,
        fp8_recipe="current" if fmt == "fp8-cs" else "delayed",
        fp8_params=not nemo1 and (dtype != "nvfp4" or release >= "26.04"),
        grad_reduce_in_fp32=False,
        precision_aware_optimizer=nemo1,
        attention_kernel="flash2" if nemo1 else "cudnn",
    )
    layout = run_layout(
        *(gpus, batch, mb, tp, pp, cp, vp),
        chunk_layers=recipe_chunks(name, system, pp, vp, batch),
        zero=3 if fsdp else 1,
        tp_comm_overlap=tp > 1 and dtype != "nvfp4",
    )
    if kind == "tokens":
        time_s = batch * seq / (value * gpus)
    else:
        causal = not nemo1 and release >= "25.09"
        time_s = model_flops_per_step(model, seq, batch, causal=causal) / (gpus * value * 1e12)
    per_domain = 64 if system == "GB200" and gpus % 64 == 0 else None
    source = f"{'NeMo' if release < '25.09' else 'Megatron-Bridge'} {release} performance summary"
    return PublishedRow("E", model, _SYSTEMS[system], gpus, training, layout, time_s, source, per_domain)


TABLE_E = [_row_e(*r) for r in _E]
