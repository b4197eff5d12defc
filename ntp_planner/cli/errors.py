"""What a command raises, as the user sees it: bad input is one sentence and exit code 2, anything
else is a bug in ntp-planner, said so in one line with exit code 1 (``--debug`` adds the traceback).

Usage errors typer finds itself (an unknown option, a value outside ``min``/``max`` or a choice)
are typer exceptions and pass through untouched; ``main()`` prints them in one line too.
"""

from __future__ import annotations

import traceback

import typer
from typer.core import TyperCommand, TyperGroup
from typer.exceptions import TyperException

# Options whose library field has another name; the value must be in the same unit.
FIELD_OPTIONS = {
    "failure_rate_per_gpu_hour": "--failure-rate",
    "straggler_rate_per_gpu_hour": "--straggler-rate",
    "lemon_host_fraction": "--lemon-fraction",
    "distribution": "--failure-dist",
}


def is_input_error(exc: BaseException) -> bool:
    """True for bad input: ``InputError``, pydantic's ``ValidationError`` and, for now, any
    ``ValueError``."""
    from pydantic import ValidationError

    from topologies.errors import InputError

    if isinstance(exc, InputError | ValidationError):
        return True
    # TODO(issue 12): narrow here. The library still raises plain ValueError for some bad input
    # while it moves to InputError; once it has, delete this line so a stray ValueError (a bug)
    # exits 1 with the internal-error line instead of passing for the user's mistake.
    return isinstance(exc, ValueError)


def input_message(exc: ValueError, command) -> str:
    """The sentence for bad input. A pydantic error about a field the command takes as an
    option names the option and the value given (``--seq-len -5: Input should be greater than
    0``), not the internal field."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return str(exc)
    from topologies.cluster_catalogue import first_error

    err = exc.errors()[0]
    option = option_for(command, err["loc"])
    if option is None:
        return first_error(exc)
    return f"{option} {err.get('input')!s}: {err['msg'].removeprefix('Value error, ')}"


def option_for(command, loc: tuple) -> str | None:
    """The command's option for a one-part pydantic error location (field ``seq_len`` ->
    ``--seq-len``, or the name in ``FIELD_OPTIONS``), or None when the command has no such option."""
    if command is None or len(loc) != 1 or not isinstance(loc[0], str):
        return None
    option = FIELD_OPTIONS.get(loc[0], "--" + loc[0].replace("_", "-"))
    return option if any(option in p.opts for p in command.params) else None


def one_line(text: str) -> str:
    return " ".join(text.split()).rstrip(".")


EXIT_CODES = {
    0: "success",
    1: "a check failed (ntp validate) or a bug in ntp-planner",
    2: "bad input: an option, a file or a combination ntp cannot use",
    3: "no layout fits: the inputs are valid but nothing fits memory (add GPUs, shorten the sequence)",
}
KINDS = {1: "internal", 2: "input", 3: "no-fit"}


def error_json(code: int, message: str) -> None:
    """The error as a JSON object on stdout, for scripts that asked for --json (the line on
    stderr is printed too)."""
    import json
    import sys

    try:
        sys.stdout.write(
            json.dumps({"error": {"code": code, "kind": KINDS.get(code, "input"), "message": message}}) + "\n"
        )
        sys.stdout.flush()
    except OSError:  # standard output is what failed (> /dev/full): the line on stderr says so
        pass


def report(exc: Exception, command, debug: bool, json_mode: bool = False) -> typer.Exit:
    """Print ``exc`` as one line on stderr (after its traceback with ``--debug``), and with
    ``json_mode`` as a JSON object on stdout; the exit to raise (``EXIT_CODES``)."""
    if debug:
        typer.echo("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip(), err=True)
    if is_input_error(exc):
        code, message = getattr(exc, "exit_code", 2), f"{one_line(input_message(exc, command))}."
        line = f"error: {message}"
    else:
        code = 1
        message = (
            f"{type(exc).__name__}: {one_line(str(exc))}; this is a bug in ntp-planner, please report it; rerun "
            "with --debug for the traceback"
        )
        line = f"internal error: {message}"
    typer.echo(line, err=True)
    if json_mode:
        error_json(code, message)
    return typer.Exit(code)


class GuardedGroup(TyperGroup):
    """The `ntp` group: runs the chosen command and turns what it raises into one line (and a
    JSON object on stdout when the command was given --json)."""

    def invoke(self, ctx):
        from ntp_planner import outputs

        outputs.stdout_claimed = False  # each command starts with stdout its own
        json_mode = "--json" in [*ctx._protected_args, *ctx.args]
        try:
            return super().invoke(ctx)
        except (TyperException, typer.Exit, typer.Abort):  # usage errors, chosen exits
            raise
        except Exception as exc:
            name = ctx.invoked_subcommand
            command = self.get_command(ctx, name) if name else None
            raise report(exc, command, bool(ctx.params.get("debug")), json_mode) from None


# The commands' parameters that name files they read (``-`` is standard input) and files they write
# (``-`` is standard output): a test checks that every path parameter is one or the other.
INPUT_PATHS = frozenset({"plan_file", "replan_file", "profile", "recovery_from", "trace", "runs_file"})
OUTPUT_PATHS = frozenset({"output", "out_dir", "plot", "trace_out", "cluster_out", "record", "checkpoint_dir"})


class GuardedCommand(TyperCommand):
    """A command that refuses two input files given as ``-`` before it reads either: standard
    input holds one file, and the second reader got what the first left, or the first read the
    other's file (``ntp simulate - --recovery-from -`` said the plan lacked recovery costs)."""

    def invoke(self, ctx):
        stdin = [p for p in self.params if p.name in INPUT_PATHS and str(ctx.params.get(p.name)) == "-"]
        if len(stdin) > 1:
            from topologies.errors import InputError

            first, second = (max(p.opts, key=len) if p.opts[0].startswith("-") else p.name for p in stdin[:2])
            raise InputError(
                f"{first} and {second} are both - (standard input), which holds one file; give one of them as a path"
            )
        return super().invoke(ctx)
