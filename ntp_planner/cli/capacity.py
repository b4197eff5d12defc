"""`ntp capacity`: which cluster, how many GPUs and spares, and which fault strategy train the
tokens by the deadline with the asked confidence, at the lowest cost."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, get_args

import typer

from ntp_planner.cli.failures import need_matplotlib
from ntp_planner.cli.options import MAX_GPUS, BatchOpt, JsonOpt, ModelOpt, SeqOpt, Strategy, parse_list
from ntp_planner.cli.output import progress, show, show_json
from topologies.errors import InputError

MAX_COUNTS = 64  # GPU counts one search tries per cluster
MAX_SPARES = 10_000  # spare domains
MAX_USD_PER_GPU_HOUR = 10_000.0  # topologies.prices.GpuHourPrice's bound
CAPACITY_PLOTS = ("deadline_probability.png", "front.png")

TokensOpt = Annotated[
    float,
    typer.Option(
        "--tokens", help="Tokens to train, e.g. 15e12; at least one step (global batch x seq len), at most 1e18."
    ),
]
DeadlineOpt = Annotated[
    float, typer.Option("--deadline-days", help="Days by which the tokens must be trained; above 0, at most 3650.")
]
ConfidenceOpt = Annotated[
    float, typer.Option("--confidence", help="Probability of meeting the deadline asked for, strictly between 0 and 1.")
]
ClustersOpt = Annotated[
    str, typer.Option("--clusters", "-c", help="Comma-separated cluster catalogue names (see `ntp clusters`).")
]
GpuRangeOpt = Annotated[
    str,
    typer.Option(
        "--gpus",
        help="GPU counts: a range A-B (multiples of A up to B: 4096-32768 is 8 counts), A-B:STEP, or a list A,B,C.",
    ),
]
SparesOpt = Annotated[str, typer.Option("--spares", help="Spare NVLink domains to try, comma-separated.")]
StrategiesOpt = Annotated[
    str, typer.Option("--strategies", help="Comma-separated: restart, dp-drop, spares, ntp, ntp-pw.")
]
CostOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--gpu-hour-cost",
        help="CLUSTER=USD per GPU-hour, repeatable; default: the GPU type's list price (topologies/prices.py), "
        "required for a GPU type without one.",
    ),
]
TrialsOpt = Annotated[int, typer.Option("--trials", help="Monte-Carlo trials per candidate, 1 to 100,000.")]
SeedOpt = Annotated[
    int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed of the failures every candidate meets.")
]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Folder for PNG plots (needs matplotlib).")]


def capacity(
    model: ModelOpt,
    tokens: TokensOpt,
    deadline_days: DeadlineOpt,
    confidence: ConfidenceOpt = 0.9,
    clusters: ClustersOpt = "dgx-h100,dgx-b200,gb200-nvl72",
    gpus: GpuRangeOpt = "4096-32768",
    spares: SparesOpt = "0,1,2,4",
    strategies: StrategiesOpt = "restart,dp-drop,spares,ntp,ntp-pw",
    gpu_hour_cost: CostOpt = None,
    seq_len: SeqOpt = 8192,
    global_batch: BatchOpt = 2048,
    trials: TrialsOpt = 200,
    seed: SeedOpt = 0,
    plot: PlotOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """What to buy to train on time: every cluster x GPU count x spare count x fault strategy,
    planned, simulated until the tokens are trained, priced with the spares paid for.

    \b
    Example: ntp capacity -m llama3.1-405b --tokens 15e12 --deadline-days 60 \\
               -c dgx-h100,dgx-b200,gb200-nvl72 --gpus 4096-32768
    """
    from cost_models import TrainingSpec, resolve_model
    from ntp_planner.failures.capacity_spec import CapacitySpec, check_one_step, check_workload
    from topologies import resolve_cluster_spec

    names = parse_list(clusters, "--clusters", str, "dgx-h100,gb200-nvl72")
    specs = {name: resolve_cluster_spec(name) for name in dict.fromkeys(names)}
    spec = CapacitySpec(
        tokens=tokens,
        deadline_days=deadline_days,
        confidence=confidence,
        gpus=parse_gpus(gpus),
        spares=_spares(spares),
        strategies=tuple(dict.fromkeys(parse_list(strategies, "--strategies", str, "restart,ntp", get_args(Strategy)))),
        trials=trials,
        seed=seed,
    )
    check_workload(spec, len(specs))  # before planning, not after
    prices, sources = gpu_hour_prices(specs, gpu_hour_cost or [])
    need_matplotlib(plot)
    if plot is not None:
        from ntp_planner.outputs import check_output_folder

        check_output_folder(plot, "--plot", CAPACITY_PLOTS)
    model_spec = resolve_model(model)
    training = TrainingSpec(seq_len=seq_len, global_batch=global_batch)
    check_one_step(tokens, training)
    result = _plan_and_search(spec, model_spec, training, specs, prices, json_out)
    if plot is not None:
        from ntp_planner.views.capacity import plot_capacity

        plot_capacity(result, spec, plot, f"{model_spec.name}, {tokens:.3g} tokens")
    if json_out:
        settings = {"tokens": tokens, "deadline_days": deadline_days, "confidence": confidence, "trials": trials}
        show_json({**result_json(result), "settings": settings | {"seed": seed}, "prices": sources})
        return
    from ntp_planner.views.capacity import capacity_view

    show(capacity_view(result, spec, model_spec.name, sources))
    if plot is not None:
        show(f"plots written to {plot}/")


def _plan_and_search(spec, model_spec, training, specs: dict, prices: dict[str, float], quiet: bool):
    """Every cluster x GPU count planned, then every candidate searched, each under its progress
    bar on stderr (none with --json)."""
    from ntp_planner.failures.capacity import search
    from ntp_planner.failures.capacity_job import plan_grid

    grid = len(specs) * len(spec.gpus)
    with progress("planning", grid, quiet) as advance:
        plans = plan_grid(model_spec, training, specs, spec.gpus, advance)
    with progress("candidates", grid * len(spec.spares) * len(spec.strategies), quiet) as advance:
        return search(spec, plans, {n: s.domain_size for n, s in specs.items()}, prices, progress=advance)


def result_json(result) -> dict:
    """The search's result as JSON values. A trial not done by its horizon's cap has an infinite
    time, and its candidate an infinite mean cost: pydantic's JSON writes those as null, where
    ``model_dump(mode="json")`` keeps the float and json.dumps would print ``Infinity``, which no
    JSON parser but Python's reads."""
    import json

    return json.loads(result.model_dump_json())


def parse_gpus(text: str) -> tuple[int, ...]:
    """--gpus as GPU counts: A-B (multiples of A up to B), A-B:STEP, or a list A,B,C.

    >>> parse_gpus("4096-32768")
    (4096, 8192, 12288, 16384, 20480, 24576, 28672, 32768)
    >>> parse_gpus("1024-2048:512"), parse_gpus("64, 128")
    ((1024, 1536, 2048), (64, 128))
    """
    usage = "a range like 4096-32768 (multiples of 4096), 4096-32768:2048 (a step) or a list like 4096,8192"
    span, _, step_text = text.partition(":")
    try:
        if "-" in text:
            lo, hi = (int(x) for x in span.split("-"))
            step = int(step_text) if step_text else lo
        else:
            counts = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise InputError(f"--gpus {text!r} must be {usage}") from None
    if "-" in text:
        if hi < lo:
            raise InputError(f"--gpus {text!r} is reversed; write the smaller count first")
        if step > 0 and lo > 0 and (hi - lo) // step + 1 > MAX_COUNTS:  # counted before a huge range is built
            raise InputError(
                f"--gpus {text!r} gives ({hi:,} - {lo:,}) / {step:,} + 1 = {(hi - lo) // step + 1:,} GPU counts; "
                f"give at most {MAX_COUNTS}"
            )
        counts = tuple(range(lo, hi + 1, step)) if step > 0 and lo > 0 else ()
    if not counts or not all(1 <= n <= MAX_GPUS for n in counts):
        raise InputError(f"--gpus {text!r} must be {usage}, each count between 1 and {MAX_GPUS:,}")
    if len(counts) > MAX_COUNTS:
        raise InputError(f"--gpus {text!r} gives {len(counts)} GPU counts; give at most {MAX_COUNTS}")
    return counts


def _spares(text: str) -> tuple[int, ...]:
    pools = parse_list(text, "--spares", int, "0,1,2,4")
    if any(not 0 <= k <= MAX_SPARES for k in pools) or len(set(pools)) < len(pools):
        raise InputError(f"--spares {text!r} must list distinct whole numbers of spare domains, 0 to {MAX_SPARES:,}")
    return tuple(pools)


def gpu_hour_prices(specs: dict, given: list[str]) -> tuple[dict[str, float], dict[str, dict]]:
    """USD per GPU-hour for each cluster, from --gpu-hour-cost CLUSTER=USD, else the default of its
    GPU type (``topologies.prices``); and where each came from. InputError for a malformed price, a
    cluster not searched, or a cluster without either."""
    from topologies.prices import GPU_HOUR_PRICES

    chosen = _given_prices(specs, given)
    prices, sources = {}, {}
    for name, spec in specs.items():
        if name in chosen:
            prices[name], source = chosen[name], "--gpu-hour-cost"
        elif spec.gpu in GPU_HOUR_PRICES:
            prices[name], source = GPU_HOUR_PRICES[spec.gpu].usd_per_gpu_hour, GPU_HOUR_PRICES[spec.gpu].source
        else:
            raise InputError(
                f"no default GPU-hour price for {spec.gpu} (cluster {name}); give one with --gpu-hour-cost {name}=USD"
            )
        sources[name] = {"usd_per_gpu_hour": prices[name], "source": source}
    return prices, sources


def _given_prices(specs: dict, given: list[str]) -> dict[str, float]:
    """--gpu-hour-cost CLUSTER=USD as USD per GPU-hour per cluster; InputError for a malformed
    price, a cluster not searched, or one priced twice differently."""
    chosen: dict[str, float] = {}
    for item in given:
        name, eq, usd_text = item.rpartition("=")  # a cluster file path may hold "="; a price never does
        name = name.strip()  # as -c strips its names
        try:
            usd = float(usd_text)
        except ValueError:
            usd = math.nan
        if not eq or not math.isfinite(usd) or not 0 < usd <= MAX_USD_PER_GPU_HOUR:
            raise InputError(
                f"--gpu-hour-cost {item!r} must be CLUSTER=USD, the USD per GPU-hour above 0 and at most "
                f"{MAX_USD_PER_GPU_HOUR:,.0f}, e.g. dgx-h100=2.5"
            )
        if name not in specs:
            raise InputError(
                f"--gpu-hour-cost {item!r} names {name!r}, which is not searched; -c lists {', '.join(specs)}"
            )
        if name in chosen and chosen[name] != usd:  # the last one winning silently hides a typo
            raise InputError(f"--gpu-hour-cost prices {name} twice ({chosen[name]:g} and {usd:g}); give it once")
        chosen[name] = usd
    return chosen
