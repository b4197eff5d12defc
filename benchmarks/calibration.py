"""Accuracy of the step-time model on published measurements (shared/reference/calibration.md).

Prints each row's measured and predicted iteration time and the error, then the mean and max
absolute error per table. Table A (A100, SC'21) holds the fitted constants; table B (H100,
Megatron-LM README) is predicted with no constant fitted to it.

Run: .venv/bin/python benchmarks/calibration.py
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from cost_models.published import TABLE_A, TABLE_B
from cost_models.step import estimate_step


def table_errors(rows, title: str, console: Console) -> list[float]:
    t = Table(title=title)
    for col in ("model", "layout", "GPUs", "measured s", "predicted s", "error", "pred. MFU"):
        t.add_column(col, justify="left" if col in ("model", "layout") else "right")
    errors = []
    for r in rows:
        cost = estimate_step(r.model, r.training, r.layout, r.cluster)
        err = cost.step_time_s / r.measured_step_time_s - 1
        errors.append(err)
        t.add_row(
            r.model.name,
            r.layout.describe(),
            str(r.gpus),
            f"{r.measured_step_time_s:.2f}",
            f"{cost.step_time_s:.2f}",
            f"{err:+.1%}",
            f"{cost.mfu:.1%}",
        )
    console.print(t)
    mean = sum(abs(e) for e in errors) / len(errors)
    console.print(f"{title}: mean |error| {mean:.1%}, max |error| {max(abs(e) for e in errors):.1%}\n")
    return errors


def main() -> None:
    console = Console(width=140)
    table_errors(TABLE_A, "Table A: Narayanan et al. SC'21, A100 (fitted)", console)
    table_errors(TABLE_B, "Table B: Megatron-LM README, H100 (predicted)", console)


if __name__ == "__main__":
    main()
