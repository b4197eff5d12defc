"""How the commands print: rich renderables and JSON to stdout, progress bars (on stderr) that vanish."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _views_to_stderr() -> bool:
    """A command whose output file goes to stdout (``-o -``) prints its table or JSON on stderr."""
    from ntp_planner import outputs

    return outputs.stdout_claimed


def width(stream) -> int | None:
    """Columns for a table: ``COLUMNS`` when set to a number, a terminal's own width (None: rich
    asks it), else 120 for pipes and files instead of rich's 80."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return min(int(columns), 1000)
    return None if stream.isatty() else 120


def show(renderable) -> None:
    """Print a rich renderable (or markup string) to stdout (stderr when stdout carries a file)."""
    from rich.console import Console

    stderr = _views_to_stderr()
    with _stream_errors(stderr):
        Console(width=width(sys.stderr if stderr else sys.stdout), stderr=stderr).print(renderable)


def show_json(data) -> None:
    stderr = _views_to_stderr()
    with _stream_errors(stderr):
        (sys.stderr if stderr else sys.stdout).write(json.dumps(data, indent=1) + "\n")


def _stream_errors(stderr: bool):
    """``outputs.stream_errors`` for the stream the views go to."""
    from ntp_planner import outputs

    return outputs.stream_errors("error" if stderr else "output")


@contextmanager
def progress(label: str, total: int, quiet: bool) -> Iterator[Callable[..., None]]:
    """A transient progress bar of ``total`` units; yields ``advance(k=1)``."""
    from rich.console import Console
    from rich.progress import Progress

    with Progress(transient=True, disable=quiet, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda k=1: bar.advance(task, k)


def with_step_progress(work, steps: int, quiet: bool):
    """Run ``work(tick)`` under a progress bar (on stderr) of the steps the slowest rank has entered."""
    if quiet:
        return work(None)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("starting ranks", total=steps)

        def tick(step: int) -> None:
            if step:
                bar.update(task, completed=step - 1, description=f"step {step} of {steps}")

        return work(tick)
