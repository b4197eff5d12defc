"""How the commands print: rich renderables and JSON to stdout, progress bars that vanish."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def show(renderable) -> None:
    """Print a rich renderable (or markup string) to stdout."""
    from rich.console import Console

    # A terminal sets its own width; pipes and files get 120 columns instead of rich's 80.
    Console(width=None if sys.stdout.isatty() else 120).print(renderable)


def show_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=1) + "\n")


@contextmanager
def progress(label: str, total: int, quiet: bool) -> Iterator[Callable[..., None]]:
    """A transient progress bar of ``total`` units; yields ``advance(k=1)``."""
    from rich.progress import Progress

    with Progress(transient=True, disable=quiet) as bar:
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
