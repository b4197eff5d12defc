"""Fit the cost model's few efficiency constants to published runs, and show what they are worth
on runs they were not fitted to.

The fitted constants (``FITTED``) are fractions of datasheet peaks with one physical meaning
each, plus the fixed per-step overhead; every other constant of ``cost_models.efficiency`` is
taken from its stated source and held. The objective is the squared log error of each run's
step time; the runs of one table on one GPU architecture in one number format (a population: H100
bf16 runs of table F, say) weigh as much as any other population, so a table of 100 runs does not
drown one of 5.

  .venv/bin/python benchmarks/fit_efficiency.py            # fit on every table, print the constants
  .venv/bin/python benchmarks/fit_efficiency.py --holdout  # predict each source from a fit on the others

The constants in ``cost_models/efficiency.py`` are this script's output, rounded; it takes about a
minute on two cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.efficiency import DEFAULT_EFFICIENCY, FORMAT_CLASS, Efficiency  # noqa: E402
from cost_models.published import all_tables  # noqa: E402

DENSE_EXCLUDED = {"G"}  # mixture-of-experts runs: their grouped GEMMs and dispatch are fitted apart
from cost_models.step import estimate_step  # noqa: E402

# name -> (where it lives in Efficiency, lower bound, upper bound, prior). The prior is where a fit
# starts, what it is pulled towards, and what a constant stays at when no run it is fitted on
# depends on it (a held-out table that alone pins it is then predicted from the prior, not from
# itself): large cuBLAS GEMMs reach
# 70-80% of the dense peak in isolation (NVIDIA's cuBLAS and Transformer Engine benchmarks), fused
# attention the FlashAttention papers' figures (Dao 2023; Shah et al. 2024), the overhead 50 ms.
PRIOR_SPREAD = 0.3  # how far (log) a prior may be off: kernel benchmarks outside training vary that much
RUN_SCATTER = 0.05  # how far (log) one run scatters about the model: settings the sources do not print
FITTED = {
    "ampere 16-bit GEMM": (("gemm_max", "ampere", "16-bit"), 0.4, 0.95, 0.7),
    "hopper 16-bit GEMM": (("gemm_max", "hopper", "16-bit"), 0.4, 0.95, 0.7),
    "blackwell 16-bit GEMM": (("gemm_max", "blackwell", "16-bit"), 0.3, 0.95, 0.7),
    "hopper fp8 GEMM": (("gemm_max", "hopper", "fp8"), 0.3, 0.95, 0.7),
    "blackwell fp8 GEMM": (("gemm_max", "blackwell", "fp8"), 0.3, 0.95, 0.7),
    "blackwell fp4 GEMM": (("gemm_max", "blackwell", "fp4"), 0.2, 0.95, 0.7),
    "hopper cuDNN attention": (("flash_efficiency", "hopper", "cudnn"), 0.2, 0.8, 0.53),
    "hopper FlashAttention-2": (("flash_efficiency", "hopper", "flash2"), 0.15, 0.6, 0.32),
    "blackwell cuDNN attention": (("flash_efficiency", "blackwell", "cudnn"), 0.2, 0.8, 0.53),
    "per-step overhead (s)": (("step_overhead_s",), 0.0, 0.15, 0.05),
}


def _set(eff: dict, path: tuple, value: float) -> None:
    for key in path[:-1]:
        eff = eff[key]
    eff[path[-1]] = value


def efficiency(values: np.ndarray) -> Efficiency:
    data = DEFAULT_EFFICIENCY.model_dump()
    for (path, *_), value in zip(FITTED.values(), values, strict=True):
        _set(data, path, float(value))
    return Efficiency(**data)


def population(table: str, run) -> tuple[str, str, str]:
    """The group a run is weighed in: its table, GPU architecture and number format class."""
    return (table, run.cluster.gpu.architecture, FORMAT_CLASS[run.training.dtype])


def residuals(values: np.ndarray, runs: list[tuple[str, object]], weights: dict[tuple, float]) -> np.ndarray:
    eff = efficiency(values)
    out = []
    for table, r in runs:
        cost = estimate_step(r.model, r.training, r.layout, r.cluster, eff)
        out.append(np.log(cost.step_time_s / r.measured_step_time_s) * weights[population(table, r)])
    return np.array(out)


def fit(runs: list[tuple[str, object]]) -> np.ndarray:
    counts: dict[tuple, int] = {}
    for table, r in runs:
        key = population(table, r)
        counts[key] = counts.get(key, 0) + 1
    weights = {t: 1 / np.sqrt(n) for t, n in counts.items()}
    prior = np.array([b[3] for b in FITTED.values()])
    lo = np.array([b[1] for b in FITTED.values()])
    hi = np.array([b[2] for b in FITTED.values()])

    def posterior(values: np.ndarray) -> np.ndarray:
        # each constant leaves its prior only as far as the runs demand: a log-normal prior of
        # spread PRIOR_SPREAD against runs that scatter by about RUN_SCATTER each
        pull = np.log(values / prior) * RUN_SCATTER / PRIOR_SPREAD
        return np.concatenate([residuals(values, runs, weights), pull])

    return least_squares(posterior, prior, bounds=(lo, hi), diff_step=1e-3, max_nfev=300).x


def errors(values: np.ndarray, runs: list[tuple[str, object]]) -> dict[str, list[float]]:
    eff = efficiency(values)
    by_table: dict[str, list[float]] = {}
    for table, r in runs:
        err = estimate_step(r.model, r.training, r.layout, r.cluster, eff).step_time_s / r.measured_step_time_s - 1
        by_table.setdefault(table, []).append(err)
    return by_table


def report(by_table: dict[str, list[float]], title: str) -> None:
    print(title)
    for table, errs in sorted(by_table.items()):
        a = np.abs(errs)
        print(f"  table {table:9s} {len(errs):3d} runs, mean |error| {a.mean():.1%}, max {a.max():.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--holdout", action="store_true", help="for each source, fit on the others and predict its runs"
    )
    args = parser.parse_args()
    # the dense constants: table G (MoE) has its own constants in cost_models.moe
    tables = {t: rows for t, rows in all_tables().items() if t not in DENSE_EXCLUDED}
    everything = [(t, r) for t, rows in tables.items() for r in rows]
    if args.holdout:
        held: dict[str, list[float]] = {}
        for source in sorted({t[0] for t in tables}):  # B and B-strong are one source
            train = [(t, r) for t, r in everything if t[0] != source]
            test = [(t, r) for t, r in everything if t[0] == source]
            held.update(errors(fit(train), test))
        report(held, "each source predicted by a fit on the others:")
        return
    values = fit(everything)
    report(errors(values, everything), "fitted on every table:")
    print("constants:")
    for name, value in zip(FITTED, values, strict=True):
        print(f"  {name:28s} {value:.3f}")


if __name__ == "__main__":
    main()
