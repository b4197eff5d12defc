"""Commands about GPU failures: replan (one failure set) and sweep (many); simulate (a whole run) is
``cli.simulate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ntp_planner.cli.options import (
    MAX_POWER,
    BatchModeOpt,
    BlastOpt,
    Fallback,
    FallbackOpt,
    JsonOpt,
    PlanArg,
    Policy,
    PowerOpt,
    SeedOpt,
    SparesOpt,
    given,
    parse_list,
)
from ntp_planner.cli.output import progress, show, show_json
from ntp_planner.outputs import check_output, write_atomic
from topologies.errors import InputError

MAX_SAMPLES = 100_000  # failure sets per fraction of a sweep

FailedOpt = Annotated[str | None, typer.Option("--failed", help="Failed GPU ids, e.g. 17,803,4410.")]
FailedFractionOpt = Annotated[
    float | None,
    typer.Option("--failed-fraction", min=0, max=1, help="Fail this share of GPUs at random."),
]
PolicyOpt = Annotated[Policy, typer.Option("--policy", help="How the job goes on without the failed GPUs.")]
ReplanOutOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Save the re-plan as JSON.")]

FractionsOpt = Annotated[str, typer.Option("--fractions", help="Failed shares, e.g. 0.0005,0.001,0.002.")]
SamplesOpt = Annotated[int, typer.Option("--samples", min=1, max=MAX_SAMPLES, help="Random failure sets per fraction.")]
PoliciesOpt = Annotated[str, typer.Option("--policies", help="Comma-separated: dp-drop, ntp, ntp-pw, spares.")]
SweepPlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write a PNG of loss against failed share.")]


# replan's own: given, they must apply to the policy (sweep takes them for every policy it runs)
ReplanFallbackOpt = Annotated[
    Fallback | None,
    typer.Option("--fallback", help="What --policy spares falls back to when they run out (default: dp-drop)."),
]
ReplanPowerOpt = Annotated[
    float | None,
    typer.Option(
        "--max-power", min=1, max=MAX_POWER, help="Largest power multiplier per GPU, for ntp-pw (default: 1.3)."
    ),
]


def replan(
    plan_file: PlanArg,
    failed: FailedOpt = None,
    failed_fraction: FailedFractionOpt = None,
    seed: SeedOpt = 0,
    blast: BlastOpt = "gpu",
    policy: PolicyOpt = "ntp",
    spares: SparesOpt = 0,
    fallback: ReplanFallbackOpt = None,
    batch: BatchModeOpt = "flexible",
    max_power: ReplanPowerOpt = None,
    output: ReplanOutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-plan a job after GPU failures: drop replicas, or run them at reduced TP (NTP).

    \b
    Example: ntp replan plan.json --failed-fraction 0.001 --seed 1 --policy ntp-pw
    """
    import numpy as np

    from ntp_planner.failures.replan import Replanner
    from ntp_planner.failures.sampling import explicit_failures, lost_domains, random_failures
    from ntp_planner.plan import Plan

    if (failed is None) == (failed_fraction is None):
        raise InputError("give exactly one of --failed (GPU ids) or --failed-fraction (a share of GPUs)")
    fallback, max_power = _replan_settings(policy, fallback, max_power)
    if output:
        check_output(output, "--output", [plan_file], "replan.json")
    p = Plan.load(plan_file)
    cluster = p.cluster.build()
    down = frozenset()
    if failed is not None:
        lost = explicit_failures(cluster, parse_list(failed, "--failed", int, "17,803,4410"))
    else:
        if failed_fraction >= 1:
            raise InputError(
                f"--failed-fraction {failed_fraction:g} must lie in [0, 1): with every GPU failed nothing is left to "
                "re-plan"
            )
        lost = random_failures(cluster, failed_fraction, np.random.default_rng(seed), blast)
        down = lost_domains(cluster, lost, blast)
    result = Replanner(p, max_power).replan(lost, policy, spares, fallback, batch, domains_down=down)
    if output:
        write_atomic(output, result.model_dump_json(indent=1))
    if json_out:
        from ntp_planner.views.model import params_json

        show_json(params_json(p.model) | result.model_dump(mode="json"))
    else:
        from ntp_planner.views.replan import replan_view

        show(replan_view(result, p.model))


def _replan_settings(policy: str, fallback: str | None, max_power: float | None) -> tuple[str, float]:
    """--fallback and --max-power with their defaults, refused where the policy does not use
    them: a fallback only decides under spares, a power limit only under ntp-pw (as the policy or
    the fallback)."""
    if fallback is not None and policy != "spares":
        raise InputError(
            f"--fallback {fallback} only applies to --policy spares, not {policy}; drop it or use --policy spares"
        )
    decider = (fallback or "dp-drop") if policy == "spares" else policy
    if max_power is not None and decider != "ntp-pw":
        raise InputError(
            f"--max-power {max_power:g} only applies when ntp-pw decides the replicas (--policy ntp-pw, or "
            f"--policy spares --fallback ntp-pw), not {decider}; drop it or use ntp-pw"
        )
    return fallback or "dp-drop", 1.3 if max_power is None else max_power


def sweep(
    ctx: typer.Context,
    plan_file: PlanArg,
    fractions: FractionsOpt = "0.0005,0.001,0.002,0.004",
    samples: SamplesOpt = 200,
    policies: PoliciesOpt = "dp-drop,ntp,ntp-pw",
    seed: SeedOpt = 0,
    blast: BlastOpt = "gpu",
    spares: SparesOpt = 0,
    fallback: FallbackOpt = "dp-drop",
    batch: BatchModeOpt = "flexible",
    max_power: PowerOpt = 1.3,
    plot: SweepPlotOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Throughput loss per policy over random failure placements (mean, p5, p95).

    \b
    Example: ntp sweep plan.json --fractions 0.0005,0.001,0.002,0.004 \\
               --samples 200 --plot loss.png
    """
    import numpy as np

    from ntp_planner.failures.sweep import sweep as run_sweep
    from ntp_planner.plan import Plan
    from ntp_planner.views.plots import plot_sweep

    shares = parse_list(fractions, "--fractions", float, "0.001,0.002")
    bad = [f for f in shares if not 0 <= f < 1]
    if bad:
        raise InputError(f"--fractions must be numbers in [0, 1); got {bad}")
    names = parse_list(policies, "--policies", str, "dp-drop,ntp")
    _refuse_unused_sweep_options(ctx, names, fallback, max_power)
    p = Plan.load(plan_file)
    need_matplotlib(plot)
    if plot is not None:
        check_output(plot, "--plot", [plan_file], "loss.png")  # before the sweep's work, not after
    rng = np.random.default_rng(seed)
    with progress("failure samples", samples * len(shares), json_out) as advance:
        rows = run_sweep(p, shares, samples, names, rng, spares, fallback, batch, blast, max_power, progress=advance)
    if plot is not None:
        plot_sweep(rows, plot, f"{p.model.name} on {p.cluster.num_gpus} x {p.cluster.spec.gpu}")
    if json_out:
        show_json([r.model_dump() for r in rows])
        return
    from ntp_planner.views.simulate import sweep_table

    show(sweep_table(rows))
    if plot is not None:
        show(f"plot written to {plot}")


def _refuse_unused_sweep_options(ctx: typer.Context, names: list[str], fallback: str, max_power: float) -> None:
    """--fallback and --max-power given (not defaulted) where no policy swept uses them, as
    ``_replan_settings`` refuses them for one policy: the sweep would ignore them and its table
    read as if it had not."""
    if given(ctx, "fallback") and "spares" not in names:
        raise InputError(
            f"--fallback {fallback} only applies to the spares policy, which --policies lacks; drop it or add spares"
        )
    if given(ctx, "max_power") and "ntp-pw" not in names and not ("spares" in names and fallback == "ntp-pw"):
        raise InputError(
            f"--max-power {max_power:g} only applies when ntp-pw decides the replicas (ntp-pw in --policies, or spares "
            "with --fallback ntp-pw); drop it or add ntp-pw"
        )


def need_matplotlib(plot: Path | None) -> None:
    import importlib.util

    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib; install the extra: pip install 'ntp-planner[plot]'")
