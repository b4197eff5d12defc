"""Table H: torchtitan's published runs (cost_models/published_titan.py) costed with the torchtitan
runtime (``Efficiency.runtime = "torchtitan"``, cost_models/titan.py): each run's measured and
predicted step time and peak memory, then the mean and max absolute errors.

Memory is compared without ``runtime_reserved`` (the CUDA context and NCCL's buffers): torchtitan
logs ``torch.cuda.max_memory_reserved``, the caching allocator's reserve, which leaves them out.

Run: .venv/bin/python benchmarks/calibration.py --table H [--markdown]
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from cost_models.efficiency import DEFAULT_EFFICIENCY
from cost_models.published_titan import TABLE_H, TitanRow
from cost_models.step import StepCost, estimate_step

TITLE_H = "Table H: torchtitan benchmarks (Dec 2024 - Jun 2025), H100 (500 W HBM2e) / H200, FSDP2 + TP + PP + CP"
GIB = 2**30


@dataclass(frozen=True)
class Result:
    """One run of table H, measured and predicted."""

    row: TitanRow
    cost: StepCost

    @property
    def step_error(self) -> float:
        return self.cost.step_time_s / self.row.measured_step_time_s - 1

    @property
    def memory_gib(self) -> float:
        parts = self.cost.memory_breakdown_bytes
        return (self.cost.memory_per_gpu_bytes - parts.get("runtime_reserved", 0.0)) / GIB

    @property
    def memory_error(self) -> float | None:
        return self.memory_gib / self.row.memory_gib - 1 if self.row.memory_is_peak else None


def cost_row(row: TitanRow) -> StepCost:
    """One run costed with the torchtitan runtime and the run's own settings."""
    eff = DEFAULT_EFFICIENCY.model_copy(update={"runtime": "torchtitan", "titan": row.titan})
    return estimate_step(row.model, row.training, row.layout, row.cluster, eff)


def results() -> list[Result]:
    return [Result(row, cost_row(row)) for row in TABLE_H]


def error_summary(errors: list[float]) -> tuple[float, float]:
    """(mean, max) absolute error."""
    absolute = [abs(e) for e in errors]
    return sum(absolute) / len(absolute), max(absolute)


def _describe(row: TitanRow) -> str:
    parts = [f"FSDP {row.fsdp}"]
    parts += [f"TP {row.tp}{' async' if row.async_tp else ''}"] if row.tp > 1 else []
    parts += [f"PP {row.pp}{' interleaved' if row.vpp > 1 else ''}"] if row.pp > 1 else []
    parts += [f"CP {row.cp}"] if row.cp > 1 else []
    parts += [f"fp8 {row.float8}"] if row.float8 else []
    parts += ["compile"] if row.titan.compile else []
    return ", ".join(parts) + f", {row.ac} AC, lb {row.local_batch}"


def summary_lines(res: list[Result]) -> list[str]:
    step = error_summary([r.step_error for r in res])
    memory = error_summary([r.memory_error for r in res if r.memory_error is not None])
    n_mem = sum(r.memory_error is not None for r in res)
    return [
        f"step time: mean |error| {step[0]:.1%}, max {step[1]:.1%} over {len(res)} runs",
        f"peak memory: mean |error| {memory[0]:.1%}, max {memory[1]:.1%} over {n_mem} runs",
    ]


def print_table_h(console: Console, as_markdown: bool = False) -> None:
    """Table H as a rich table (or markdown rows) with its summary."""
    res = results()
    if as_markdown:
        print(f"### {TITLE_H}\n")
        print("| run | model | GPUs | layout | seq | measured s | predicted s | error | GiB | predicted GiB |")
        print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in res:
            mem = "-" if r.row.memory_gib is None else f"{r.row.memory_gib:.1f}"
            print(
                f"| {r.row.label} | {r.row.model_name} | {r.row.gpus} | {_describe(r.row)} | {r.row.seq_len} | "
                f"{r.row.measured_step_time_s:.2f} | {r.cost.step_time_s:.2f} | {r.step_error:+.1%} | {mem} | "
                f"{r.memory_gib:.1f} |"
            )
        print("\n" + "; ".join(summary_lines(res)))
        return
    table = Table(title=TITLE_H)
    for name in ("run", "model", "GPUs", "layout", "seq", "measured s", "predicted s", "error", "GiB", "pred GiB"):
        table.add_column(name, justify="right" if name not in ("run", "model", "layout") else "left")
    for r in res:
        mem = "-" if r.row.memory_gib is None else f"{r.row.memory_gib:.1f}"
        table.add_row(
            r.row.label,
            r.row.model_name,
            str(r.row.gpus),
            _describe(r.row),
            str(r.row.seq_len),
            f"{r.row.measured_step_time_s:.2f}",
            f"{r.cost.step_time_s:.2f}",
            f"{r.step_error:+.1%}",
            mem,
            f"{r.memory_gib:.1f}",
        )
    console.print(table)
    for line in summary_lines(res):
        console.print(line)
