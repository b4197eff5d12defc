"""`ntp calibrate`: refine a profile's constants from measured validate runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ntp_planner.cli.options import JsonOpt
from ntp_planner.cli.output import show, show_json

RunsArg = Annotated[
    Path, typer.Argument(help="Runs recorded by `ntp validate PLAN --profile P --record runs.jsonl` (JSON lines).")
]
BaseProfileOpt = Annotated[Path, typer.Option("--profile", help="The profile the runs were predicted with.")]
CalibratedOutOpt = Annotated[
    Path, typer.Option("--output", "-o", help="Where to write the calibrated profile (written atomically).")
]


def calibrate(runs_file: RunsArg, profile: BaseProfileOpt, output: CalibratedOutOpt, json_out: JsonOpt = False) -> None:
    """Fit the profile's compute and communication multipliers and per-step overhead to measured
    validate runs, and write the calibrated profile with each run's residual.

    \b
    Example: ntp calibrate runs.jsonl --profile p.json -o p.calibrated.json
    """
    from cost_models.calibrate import calibrate as fit
    from cost_models.calibrate import read_runs
    from cost_models.profile import load_profile, profile_json
    from ntp_planner.outputs import check_output, write_atomic

    check_output(output, "--output", [runs_file, profile], "profile.json")
    calibrated = fit(load_profile(profile), read_runs(runs_file))
    write_atomic(output, profile_json(calibrated))
    cal = calibrated.calibration
    if json_out:
        show_json(
            {
                "compute_scale": cal.compute_scale,
                "comm_scale": cal.comm_scale,
                "step_overhead_s": cal.step_overhead_s,
                "runs": [r.model_dump(mode="json") | {"residual": r.residual} for r in cal.runs],
                "output": str(output),
            }
        )
        return
    from ntp_planner.views.timing import calibration_view

    show(calibration_view(calibrated))
    show(f"calibrated profile written to {output}")
