"""The `ntp` command: one typer app, a thin layer over the library. Only this package prints.

The commands live by subject: ``plan`` (models, clusters, plan, explain), ``estimate``, ``failures``
(replan, sweep, simulate), ``capacity``, ``export`` (export, validate) and ``profile``; ``options`` holds the
shared options and choices, ``errors`` turns what a command raises into one line. Heavy imports (pydantic models,
numpy, rich tables) happen inside commands so `ntp --help` stays fast; torch is imported only by
`ntp validate` and `ntp profile`.
"""

from __future__ import annotations

import math
import sys
from typing import Annotated

import typer

from ntp_planner.cli import calibrate, capacity, estimate, export, failures, plan, profile, simulate, validate
from ntp_planner.cli.errors import EXIT_CODES, GuardedCommand, GuardedGroup, error_json

EPILOG = "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + "."

app = typer.Typer(
    cls=GuardedGroup,
    help="Plan how to parallelise LLM training over thousands of GPUs, and what failures cost.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: nothing cut at 80 columns, no <bool> on flags
)

COMMANDS = (
    ("models", plan.models),
    ("clusters", plan.clusters),
    ("plan", plan.plan),
    ("estimate", estimate.estimate),
    ("explain", plan.explain),
    ("replan", failures.replan),
    ("sweep", failures.sweep),
    ("simulate", simulate.simulate),
    ("capacity", capacity.capacity),
    ("export", export.export_cmd),
    ("validate", validate.validate),
    ("profile", profile.profile),
    ("calibrate", calibrate.calibrate),
)
for _name, _fn in COMMANDS:
    app.command(name=_name, cls=GuardedCommand)(_fn)


def version() -> str:
    """The installed distribution's version, or the package's when it runs from a source tree."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("ntp-planner")
    except PackageNotFoundError:
        from ntp_planner import __version__

        return __version__


def _print_version(show: bool) -> None:
    if show:
        typer.echo(f"ntp-planner {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="On an error, print the Python traceback too.")] = False,
) -> None:
    """Plan how to parallelise LLM training over thousands of GPUs, and what failures cost."""


def _range_message(exc: Exception) -> str | None:
    """``--tp 0: Input should be greater than or equal to 1`` for a value outside an option's
    ``min``/``max`` (typer checks it with pydantic and keeps the value only in the cause), and
    ``--days nan: Input should be a finite number`` for nan or inf; None for other usage errors."""
    from pydantic import ValidationError

    cause, param = exc.__cause__ or exc.__context__, getattr(exc, "param", None)
    if param is None or not isinstance(cause, ValidationError) or not param.opts:
        return None
    err = cause.errors()[0]
    option, value = max(param.opts, key=len), err.get("input")
    try:
        finite = math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        finite = True
    msg = err["msg"].removeprefix("Value error, ") if finite else "Input should be a finite number"
    return f"{option} {value}: {msg}"


def main() -> None:
    """The ``ntp`` entry point. A usage error (an unknown option, a value out of range) ends in one
    line on stderr and exit code 2, like every other bad input; bare ``ntp`` prints the help."""
    from typer._click.exceptions import NoArgsIsHelpError
    from typer.exceptions import TyperException

    try:
        code = app(prog_name="ntp", standalone_mode=False)
    except NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help())
        code = 0
    except TyperException as exc:
        where = exc.ctx.command_path if getattr(exc, "ctx", None) else "ntp"
        message = _range_message(exc) or " ".join(exc.format_message().replace("Value error, ", "").split())
        message = f"{message.rstrip('.')}; run `{where} --help` for the options."
        typer.echo(f"error: {message}", err=True)
        code = getattr(exc, "exit_code", 2)
        if "--json" in sys.argv[1:]:
            error_json(code, message)
    except typer.Abort:
        typer.echo("aborted.", err=True)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
