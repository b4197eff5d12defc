"""The options the commands share, as ``Annotated`` types, the choices they take, and the one
parser of comma lists.

Choices are ``Literal`` types, so typer checks them and lists them in the help. Each mirrors a
vocabulary of the library (``cost_models.training.Dtype``, ``failures.replan.Policy``, ...); they
are spelled here so that `ntp --help` imports nothing heavy, and a test checks that they agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from topologies.errors import InputError

Dtype = Literal["fp16", "bf16", "fp8", "mxfp8", "nvfp4"]
Fp8Recipe = Literal["delayed", "current"]
AttentionKernel = Literal["cudnn", "flash2"]
Runtime = Literal["megatron", "torchtitan"]
GradReduce = Literal["fp32", "bf16"]
Recompute = Literal["none", "selective", "full"]
Dispatcher = Literal["alltoall", "allgather", "flex"]
MoeOverlap = Literal["none", "1f1b", "dualpipe"]
FlexBackend = Literal["deepep", "hybridep"]
Objective = Literal["step-time", "goodput"]
Strategy = Literal["restart", "dp-drop", "spares", "ntp", "ntp-pw"]
Policy = Literal["dp-drop", "ntp", "ntp-pw", "spares"]
Fallback = Literal["dp-drop", "ntp", "ntp-pw"]
BatchMode = Literal["flexible", "fixed"]
Blast = Literal["gpu", "node", "domain"]
FailureDist = Literal["poisson", "weibull"]
Start = Literal["steady", "healthy"]
Format = Literal["megatron", "nemo", "nemo2", "bridge", "torchtitan", "json"]
Backend = Literal["gloo", "nccl"]

# ---- upper bounds of the numeric options ---------------------------------------------------
# Each is physical (no machine holds more) and mirrors the library's bound; a test checks they agree.
MAX_GPUS = 1_000_000  # topologies.cluster.MAX_GPUS: ten times the largest cluster built
MAX_SEQ_LEN = 10**9  # cost_models.training: the longest contexts trained are about 10**7 tokens
MAX_GLOBAL_BATCH = 10_000_000  # cost_models.training.MAX_GLOBAL_BATCH
MAX_LAYERS = 10_000  # cost_models.model.MAX_LAYERS
MAX_POWER = 2.0  # cost_models.degraded.MAX_POWER: no GPU board allows twice its default power
MAX_SEED = 2**63 - 1  # numpy's generators take any int; a signed 64-bit one is what others store
MAX_PROCS = 4096  # local processes one machine runs (validate, profile)


# ---- the three inputs and the training spec (plan, estimate) -------------------------------
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Catalogue name (see `ntp models`) or a config.json / YAML path; a catalogue name wins over a "
        "same-named file or folder here (write ./NAME for it).",
    ),
]
ClusterOpt = Annotated[
    str,
    typer.Option(
        "--cluster",
        "-c",
        help="Catalogue name (see `ntp clusters`) or a cluster YAML/JSON path; a catalogue name wins over a "
        "same-named file here (write ./NAME for it).",
    ),
]
GpusOpt = Annotated[
    int, typer.Option("--gpus", "-n", min=1, max=MAX_GPUS, help="Number of GPUs, a multiple of the host size.")
]
GpusPerDomainOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-domain",
        min=1,
        max=MAX_GPUS,
        help="GPUs used per NVLink domain (default: all); the rest are in-domain spares.",
    ),
]
SeqOpt = Annotated[int, typer.Option("--seq-len", min=1, max=MAX_SEQ_LEN, help="Tokens per sequence.")]
BatchOpt = Annotated[
    int, typer.Option("--global-batch", min=1, max=MAX_GLOBAL_BATCH, help="Sequences per optimizer step.")
]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="GEMM format: fp8 needs Hopper+, mxfp8 and nvfp4 Blackwell.")]
Fp8RecipeOpt = Annotated[
    Fp8Recipe, typer.Option("--fp8-recipe", help="fp8 scaling: delayed (amax history) or current (tensorwise).")
]
Fp8ParamsOpt = Annotated[
    bool, typer.Option("--fp8-params", help="Keep weights in the fp8/fp4 format (Megatron --fp8-param-gather).")
]
GradReduceOpt = Annotated[
    GradReduce | None,
    typer.Option("--grad-reduce", help="Gradient buffer and reduction (default: fp32 for bf16, 16 bits otherwise)."),
]
PrecisionAwareOpt = Annotated[
    bool,
    typer.Option(
        "--precision-aware-optimizer", help="Adam keeps 16-bit master-weight remainders (10 bytes of state/param)."
    ),
]
AttentionKernelOpt = Annotated[
    AttentionKernel | None,
    typer.Option(
        "--attention-kernel",
        help="Fused attention: cudnn (TE's default) or flash2 (FlashAttention-2). Default: what the runtime runs, "
        "cudnn for megatron, flash2 for torchtitan (PyTorch SDPA's flash backend).",
        show_default=False,
    ),
]


def attention_kernel_for(kernel: str | None, runtime: str) -> str:
    """The attention kernel the user named, else the one ``runtime`` runs: torchtitan calls
    PyTorch's SDPA, whose flash backend is FlashAttention-2; Megatron-Core runs TE's cuDNN kernel.

    >>> attention_kernel_for(None, "torchtitan"), attention_kernel_for(None, "megatron")
    ('flash2', 'cudnn')
    >>> attention_kernel_for("cudnn", "torchtitan")
    'cudnn'
    """
    if kernel is not None:
        return kernel
    return "flash2" if runtime == "torchtitan" else "cudnn"


FusedLossOpt = Annotated[
    bool, typer.Option("--fused-cross-entropy/--unfused-cross-entropy", help="Fused loss kernel (TE) or Megatron's.")
]
FlashOpt = Annotated[bool, typer.Option("--flash-attention/--no-flash-attention", help="Fused attention kernels.")]
HeadroomOpt = Annotated[
    float,
    typer.Option("--headroom", min=0, max=0.99, help="Fraction of HBM kept free (fragmentation, spikes), below 1."),
]


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the command's option ``name`` was given (on the command line or from the
    environment), not left at its default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def refuse_unused_training(
    dtype: str, fp8_recipe: str, moe_dispatcher: str = "alltoall", moe_flex_backend: str | None = None
) -> None:
    """Options the run would drop without a word: --fp8-recipe current without fp8 GEMMs (as
    --fp8-params without a low-precision format is refused; the default, delayed, passes with any
    format: scripts that always pass it, as the calibration tables do, stay valid), and
    --moe-flex-backend without the flex dispatcher it configures."""
    if fp8_recipe != "delayed" and dtype != "fp8":
        raise InputError(
            f"--fp8-recipe {fp8_recipe} scales fp8 GEMMs and --dtype {dtype} runs none; drop it or use --dtype fp8"
        )
    if moe_flex_backend is not None and moe_dispatcher != "flex":
        raise InputError(
            f"--moe-flex-backend {moe_flex_backend} picks the flex dispatcher's backend and --moe-dispatcher is "
            f"{moe_dispatcher}; add --moe-dispatcher flex or drop it"
        )


# ---- output ------------------------------------------------------------------------------
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]
OutOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Save the Plan as JSON here (written atomically).")]
PlanArg = Annotated[Path, typer.Argument(help="A plan written by `ntp plan -o` or `ntp estimate -o`.")]
ProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--profile",
        help="A profile from `ntp profile`: its measured block and collective times replace the analytical "
        "terms where they cover the shape (the output lists where they did not). Its GPU must be the cluster's.",
    ),
]

RuntimeOpt = Annotated[
    Runtime,
    typer.Option(
        "--runtime",
        help="What runs the step: megatron (Megatron-Core) or torchtitan (FSDP2, ring-attention CP, per-op SAC, "
        "torchao float8, torch.compile; cost_models/titan.py). Recorded in the plan.",
    ),
]


def profile_efficiency(path: Path | None, gpu_name: str, runtime: str = "megatron"):
    """The cost model's constants for ``runtime`` with the profile at ``path`` on top (the
    defaults when None); InputError when the profile is unreadable or measured on another GPU
    than ``gpu_name``."""
    from cost_models.efficiency import DEFAULT_EFFICIENCY

    if path is None:
        return DEFAULT_EFFICIENCY if runtime == "megatron" else DEFAULT_EFFICIENCY.with_profile(None, runtime)
    from cost_models.profile import load_profile

    profile = load_profile(path)
    profile.check_gpu(gpu_name, f"profile {path}")
    return DEFAULT_EFFICIENCY.with_profile(profile, runtime)


# ---- failures (replan, sweep, simulate) ---------------------------------------------------
SparesOpt = Annotated[
    int, typer.Option("--spares", min=0, max=MAX_GPUS, help="Idle spare NVLink domains (for spares).")
]
FallbackOpt = Annotated[Fallback, typer.Option("--fallback", help="What spares fall back to when they run out.")]
BatchModeOpt = Annotated[BatchMode, typer.Option("--batch", help="flexible (shrinks) or fixed (pauses when short).")]
PowerOpt = Annotated[
    float,
    typer.Option("--max-power", min=1, max=MAX_POWER, help="Largest power multiplier per GPU (ntp-pw)."),
]
SeedOpt = Annotated[
    int,
    typer.Option("--seed", min=0, max=MAX_SEED, help="Seed for random failures (the same seed, the same failures)."),
]
BlastOpt = Annotated[Blast, typer.Option("--blast", help="What one failure takes down.")]

_KINDS = {int: "whole numbers", float: "numbers", str: "names"}


def parse_list(text: str, option: str, kind: type = str, example: str = "", choices: tuple[str, ...] = ()) -> list:
    """The comma list ``text`` given to ``option`` as values of ``kind`` (int, float or str),
    each one of ``choices`` when given; blanks around and between commas are ignored, an empty
    list is refused.

    >>> parse_list("17, 803,4410", "--failed", int)
    [17, 803, 4410]
    >>> parse_list("restart,,ntp", "--strategies")
    ['restart', 'ntp']
    >>> parse_list(" , ", "--fractions", float, "0.001,0.002")
    Traceback (most recent call last):
    topologies.errors.InputError: --fractions ' , ' lists nothing; give comma-separated numbers, e.g. 0.001,0.002
    >>> parse_list("restart,magic", "--strategies", choices=("restart", "ntp"))
    Traceback (most recent call last):
    topologies.errors.InputError: --strategies 'restart,magic': magic is not one of restart, ntp
    """
    words = [w.strip() for w in text.split(",") if w.strip()]
    eg = f", e.g. {example}" if example else ""
    if not words:
        raise InputError(f"{option} {text!r} lists nothing; give comma-separated {_KINDS[kind]}{eg}")
    try:
        values = [kind(w) for w in words]
    except ValueError:
        raise InputError(f"{option} {text!r} must be comma-separated {_KINDS[kind]}{eg}") from None
    unknown = [v for v in values if choices and v not in choices]
    if unknown:
        raise InputError(f"{option} {text!r}: {', '.join(map(str, unknown))} is not one of {', '.join(choices)}")
    return values
