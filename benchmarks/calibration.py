"""Accuracy of the step-time model on published measurements (shared/reference/calibration.md
tables A-D; table E, more NeMo / Megatron-Bridge runs, cost_models/published_runs.py; table F,
NVIDIA's DGX Cloud recipes in bf16 and fp8, cost_models/published_dgxc.py; table G, the MoE runs of
the Megatron-Bridge performance summaries, cost_models/published_moe.py, with the runs whose layout
cannot be costed as printed listed after it with the reason).

Prints each run's layout, measured and predicted step time, the error and whether it fits in
memory, then the mean and max absolute error per table (with --markdown, tables E and F are
summarised per source, model, GPU and format). The settings each publication left
unstated are chosen once per table; they are printed above each table (the modules'
docstrings give the reasons). The efficiency constants were fitted to all of these runs together
by benchmarks/fit_efficiency.py (`--holdout` there shows the error on runs left out of the fit).

Run: .venv/bin/python benchmarks/calibration.py [--table A] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.calibration_titan import print_table_h  # noqa: E402
from cost_models import published, published_dgxc, published_moe, published_runs  # noqa: E402
from cost_models.published import all_tables  # noqa: E402
from cost_models.step import estimate_step  # noqa: E402
from topologies.errors import InputError  # noqa: E402

TITLES = {
    "A": "Table A: Narayanan et al. SC'21, A100, fp16",
    "B": "Table B: Megatron-LM README weak scaling, H100, bf16",
    "B-strong": "Table B: Megatron-LM README strong scaling of the 177B model, H100, bf16",
    "C": "Table C: NeMo 24.07, H100, fp8 (delayed scaling)",
    "D": "Table D: Megatron-Bridge, H100, fp8 (current scaling)",
    "E": "Table E: NeMo and Megatron-Bridge, H100 / B200 / GB200, fp8 / mxfp8 / nvfp4",
    "F": "Table F: NVIDIA DGX Cloud recipes (NeMo 24.05-25.04), H100 / GB200, bf16 and fp8",
    "G": "Table G: Megatron-Bridge 25.09-26.08 MoE pre-training, H100 / B200 / B300 / GB200 / GB300",
}
MODULES = {"E": published_runs, "F": published_dgxc, "G": published_moe}  # settings in their own module
EXCLUDED = {"G": published_moe.excluded_g}  # runs left out of a table, each with its reason


def settings(table: str) -> str:
    """The paragraph of the module docstring that states the table's unstated settings."""
    doc = (MODULES.get(table, published).__doc__) or ""
    key = "Settings" if table in MODULES else "Table B" if table == "B-strong" else f"Table {table}"
    paragraphs = doc.split("\n\n")
    for i, para in enumerate(paragraphs):
        if para.startswith(key):
            # a paragraph that ends in a colon introduces the list that follows it
            return " ".join(" ".join(paragraphs[i : i + 2 if para.rstrip().endswith(":") else i + 1]).split())
    return ""


def rows_of(table: str, failed: list[str] | None = None):
    """Each run of ``table`` with its cost and error. With ``failed``, a run the cost model refuses
    or fails on is recorded there (run and message, printed after the table) instead of raising."""
    for r in all_tables()[table]:
        try:
            cost = estimate_step(r.model, r.training, r.layout, r.cluster)
        except (InputError, ValueError) as exc:
            if failed is None:
                raise
            run = f"{r.model.name} {r.source} {r.gpus} GPUs {r.layout.describe()}"
            failed.append(f"- {run}: {type(exc).__name__}: {exc}")
            continue
        yield r, cost, cost.step_time_s / r.measured_step_time_s - 1


def failed_lines(table: str, failed: list[str]) -> list[str]:
    return [f"{len(failed)} runs of table {table} the cost model could not cost:", *failed, ""] if failed else []


def rich_table(table: str, console: Console) -> list[float]:
    t = Table(title=TITLES[table], caption=settings(table), caption_justify="left")
    where = "source" if table in MODULES else "GPUs"
    for col in ("model", where, "layout", "measured s", "predicted s", "error", "fits"):
        t.add_column(col, justify="left" if col in ("model", "layout", "source") else "right")
    errors: list[float] = []
    failed: list[str] = []
    rows = list(rows_of(table, failed))
    for r, cost, err in rows:
        errors.append(err)
        where = f"{r.source.split(',')[-1].strip() if table in MODULES else ''} {r.gpus}x{r.cluster.gpu.name}".strip()
        t.add_row(
            r.model.name,
            where if table in MODULES else str(r.gpus),
            f"{r.training.dtype} {r.layout.describe()}",
            f"{r.measured_step_time_s:.2f}",
            f"{cost.step_time_s:.2f}",
            f"{err:+.1%}",
            "yes" if cost.fits() else f"no ({cost.memory_per_gpu_bytes / 2**30:.0f} GiB)",
        )
    console.print(t)
    console.print(f"{TITLES[table]}: {summary(errors)}\n")
    for line in footer_lines(table, failed, rows):
        console.print(line)
    return errors


def summary(errors: list[float]) -> str:
    if not errors:
        return "0 runs"
    mean = sum(abs(e) for e in errors) / len(errors)
    return f"{len(errors)} runs, mean |error| {mean:.1%}, max |error| {max(map(abs, errors)):.1%}"


def excluded_lines(table: str) -> list[str]:
    """The runs left out of ``table`` (their layout cannot be costed as printed), with the reason."""
    if table not in EXCLUDED:
        return []
    left = EXCLUDED[table]()
    lines = [f"{len(left)} runs of table {table} left out:"] if left else []
    lines += [f"- {x.model} {x.release} {x.system} {x.description}: {x.reason}" for x in left]
    return lines + ([""] if left else [])


def same_inputs(table: str) -> list[list]:
    """Groups of two or more runs of ``table`` that are one input to the cost model (model,
    cluster, training, layout all equal: reruns in later releases), the widest spread first."""
    groups: dict[str, list] = {}
    for r in all_tables()[table]:
        parts = (r.model, r.training, r.layout)
        key = "|".join(x.model_dump_json() for x in parts) + f"|{r.cluster.spec.name}|{r.cluster.num_gpus}"
        groups.setdefault(key, []).append(r)
    many = [g for g in groups.values() if len(g) > 1]
    return sorted(many, key=lambda g: -max(x.measured_step_time_s for x in g) / min(x.measured_step_time_s for x in g))


def least_summed_error(values: list[float]) -> float:
    """The least sum of |p / v - 1| over the ``values`` by one number p, which is found at one of
    them (the sum is convex and piecewise linear in p, with its kinks at the values).

    >>> least_summed_error([1.0, 2.0])  # p = 1: 0 + 0.5; p = 2: 1 + 0
    0.5
    >>> least_summed_error([1.0, 1.0, 4.0])  # p = 1: 0 + 0 + 0.75
    0.75
    """
    return min(sum(abs(p / v - 1) for v in values) for p in values)


def floor_lines(table: str) -> list[str]:
    """What no deterministic model of these inputs can beat: one prediction per input, so for
    runs that share their inputs the best is the value minimising their summed |error| (checked
    at each measured value: the optimum of a sum of |p / y - 1| lies at one of them). Gives the
    least mean |error| over the table, and the runs that cannot all be within 20% (a spread over
    1.2 / 0.8 = 1.5)."""
    groups = same_inputs(table)
    if not groups:
        return []
    n, floor, lines = len(all_tables()[table]), 0.0, []
    for g in groups:
        ys = [x.measured_step_time_s for x in g]
        floor += least_summed_error(ys)
        if max(ys) / min(ys) > 1.5:
            r = g[0]
            lines.append(
                f"- {r.model.name} {r.system} {r.layout.describe()}: {' / '.join(f'{y:.2f}' for y in ys)} s in "
                f"{', '.join(x.release for x in g)} ({max(ys) / min(ys):.2f}x): one of them is off by more than 20%"
            )
    head = (
        f"{sum(map(len, groups))} runs of table {table} share their inputs with another ({len(groups)} groups); "
        f"their spread alone puts a floor of {floor / n:.2%} under the table's mean |error| (over {n} runs)"
    )
    return [head, *lines, ""]


ORACLE_GROUPS = {
    "model": lambda r: r.model.name,
    "model x GPU": lambda r: (r.model.name, r.cluster.gpu.name),
}


def oracle_lines(table: str, rows: list) -> list[str]:
    """How far a correction the cost model cannot make would take the table: one free factor on
    the predictions of each group (each model; each model on each GPU), chosen afterwards to
    minimise the group's summed |error|. What such a factor cannot remove is the variation inside
    the group (releases, layouts, micro-batch sizes), which only the model's own terms can follow;
    a goal below a line's figure needs the model to get those right, not a better level. The
    factor f minimising sum |f r - 1| over a group's ratios r = predicted / measured is
    ``least_summed_error`` of 1 / r. Only for tables of many runs per model (E, F, G)."""
    if table not in MODULES or not rows:
        return []
    lines = []
    for name, key in ORACLE_GROUPS.items():
        groups: dict = {}
        for r, _, err in rows:
            groups.setdefault(key(r), []).append(1 / (1 + err))
        left = sum(least_summed_error(g) for g in groups.values()) / len(rows)
        lines.append(f"- one free factor per {name} ({len(groups)} groups): mean |error| {left:.2%}")
    return [f"What a correction fitted afterwards would leave of table {table}'s {len(rows)} runs:", *lines, ""]


def footer_lines(table: str, failed: list[str], rows: list) -> list[str]:
    """The lines under a table, in either format: its failed and excluded runs, its floor and what a
    fitted correction would leave."""
    return failed_lines(table, failed) + excluded_lines(table) + floor_lines(table) + oracle_lines(table, rows)


def markdown(table: str) -> None:
    print(f"{TITLES[table]}\n")
    failed: list[str] = []
    rows = list(rows_of(table, failed))
    errors = [err for _, _, err in rows]
    if table in MODULES:  # too many runs to list: one line per source, model, GPU and format
        groups: dict[tuple, list[float]] = {}
        for r, _, err in rows:
            key = (r.source.split(",")[-1].strip(), r.model.name, r.cluster.gpu.name, r.training.dtype)
            groups.setdefault(key, []).append(err)
        print("| source | model | GPU | format | runs | mean error | max abs error |")
        print("|---|---|---|---|---|---|---|")
        for (source, model, gpu, dtype), errs in groups.items():
            mean, worst = sum(errs) / len(errs), max(map(abs, errs))
            print(f"| {source} | {model} | {gpu} | {dtype} | {len(errs)} | {mean:+.1%} | {worst:.1%} |")
    else:
        print("| model | GPUs | layout | measured s | predicted s | error |")
        print("|---|---|---|---|---|---|")
        for r, cost, err in rows:
            gpus = f"{r.gpus} {r.cluster.gpu.name}"
            print(
                f"| {r.model.name} | {gpus} | {r.training.dtype} {r.layout.describe()} | "
                f"{r.measured_step_time_s:.2f} | {cost.step_time_s:.2f} | {err:+.1%} |"
            )
    print(f"\n**{table}: {summary(errors)}**\n")
    for line in footer_lines(table, failed, rows):
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=[*TITLES, "H"], help="one table only (H: torchtitan, calibration_titan)")
    parser.add_argument("--markdown", action="store_true", help="markdown rows for benchmarks/README.md")
    args = parser.parse_args()
    tables = [args.table] if args.table else [*TITLES, "H"]
    console = Console(width=160)
    for table in tables:
        if table == "H":
            print_table_h(console, args.markdown)
            continue
        if args.markdown:
            markdown(table)
        else:
            rich_table(table, console)


if __name__ == "__main__":
    main()
