"""Fit the torchtitan runtime's constants to table H (cost_models/published_titan.py) and show
what they are worth on runs they were not fitted to.

Five constants are fitted, four to step time and one to memory:

- ``GRAND_TETON_CLOCK`` (published_titan): the Grand Teton H100s' tensor peak over the SXM's. The
  source bounds it ("between SXM and NVL": 0.845 to 1) but does not give it; the value in the code
  was picked from that range by fitting, so it counts as a fitted constant here.
- ``TitanSettings.eager_memory_factor``, ``rowwise_gemm_fraction``, ``attention_factor``.
- ``TitanSettings.allocator_reserve_fraction`` (memory only), over the runs whose memory figure is
  a peak (``TitanRow.memory_is_peak``).

Every other constant is the Megatron runtime's (cost_models/efficiency.py), held. A fit starts at
each constant's prior and is pulled back towards it (log-normal, spread PRIOR_SPREAD against runs
scattering by RUN_SCATTER), so a constant that the training runs do not pin stays near its prior:
a held-out source that alone pins a constant is then predicted from the prior, not from itself.
The priors are round numbers set before fitting, not the fitted values: the middle of the clock's
sourced range, eager passes costing 1.5x the fused ones, rowwise GEMMs at 0.8 of tensorwise, SDPA
at 0.9 of the fused-attention fraction, a reserve of 10%.

  .venv/bin/python benchmarks/fit_titan.py            # fit on all of table H, print the constants
  .venv/bin/python benchmarks/fit_titan.py --holdout  # each source predicted by a fit on the other two
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.efficiency import DEFAULT_EFFICIENCY  # noqa: E402
from cost_models.published_titan import GRAND_TETON_CLOCK, TABLE_H, TitanRow  # noqa: E402
from cost_models.step import StepCost, estimate_step  # noqa: E402

PRIOR_SPREAD = 0.3  # log: how far a round-number prior may be off
RUN_SCATTER = 0.05  # log: how far one run scatters about the model (settings the sources leave out)
# name -> (lower bound, upper bound, prior)
STEP_CONSTANTS = {
    "grand_teton_clock": (835 / 989, 1.0, 0.92),
    "eager_memory_factor": (1.0, 4.0, 1.5),
    "rowwise_gemm_fraction": (0.2, 1.0, 0.8),
    "attention_factor": (0.3, 1.0, 0.9),
}
MEMORY_CONSTANT = ("allocator_reserve_fraction", 0.0, 0.5, 0.10)
GIB = 2**30


def in_code() -> dict[str, float]:
    """The constants as the code holds them (the defaults of TitanSettings and the clock)."""
    s = TABLE_H[0].titan
    values = {name: getattr(s, name) for name in STEP_CONSTANTS if name != "grand_teton_clock"}
    return {"grand_teton_clock": GRAND_TETON_CLOCK, **values, MEMORY_CONSTANT[0]: s.allocator_reserve_fraction}


def cost(row: TitanRow, constants: dict[str, float]) -> StepCost:
    """``row`` costed by the torchtitan runtime with ``constants`` in place of the code's."""
    settings = {k: v for k, v in constants.items() if k != "grand_teton_clock"}
    titan = row.titan.model_copy(update=settings)
    eff = DEFAULT_EFFICIENCY.model_copy(update={"runtime": "torchtitan", "titan": titan})
    return estimate_step(row.model, row.training, row.layout, row.cluster_at(constants["grand_teton_clock"]), eff)


def memory_gib(c: StepCost) -> float:
    """Predicted peak as torchtitan logs it: without the CUDA context and NCCL's buffers."""
    return (c.memory_per_gpu_bytes - c.memory_breakdown_bytes.get("runtime_reserved", 0.0)) / GIB


def _weights(rows: list[TitanRow]) -> list[float]:
    """Each source weighs as much as any other, whatever its number of runs."""
    counts = {r.source: sum(x.source == r.source for x in rows) for r in rows}
    return [1 / np.sqrt(counts[r.source]) for r in rows]


def fit_step(rows: list[TitanRow]) -> dict[str, float]:
    """The step-time constants that best fit ``rows`` (squared log error, priors as pulls)."""
    lo, hi, prior = (np.array(b) for b in zip(*STEP_CONSTANTS.values(), strict=True))
    weights = _weights(rows)

    def residuals(values: np.ndarray) -> np.ndarray:
        constants = dict(zip(STEP_CONSTANTS, values, strict=True))
        errs = [
            w * np.log(cost(r, constants).step_time_s / r.measured_step_time_s)
            for r, w in zip(rows, weights, strict=True)
        ]
        return np.concatenate([errs, np.log(values / prior) * RUN_SCATTER / PRIOR_SPREAD])

    x = least_squares(residuals, prior, bounds=(lo, hi), diff_step=1e-3, max_nfev=200).x
    return dict(zip(STEP_CONSTANTS, map(float, x), strict=True))


def fit_memory(rows: list[TitanRow]) -> float:
    """The allocator reserve that best fits the peak-memory runs among ``rows``; the prior
    where there are none. The reserve scales what is allocated: log(1 + f) is the mean of the
    runs' log(measured / allocated), pulled towards the prior. Every run weighs the same (the goal
    is a bound run by run, and one source states 18 of the 20 peaks)."""
    name, lo, hi, prior = MEMORY_CONSTANT
    peaks = [r for r in rows if r.memory_is_peak]
    if not peaks:
        return prior
    weights = np.ones(len(peaks))
    base = {name: 0.0, "grand_teton_clock": GRAND_TETON_CLOCK}
    logs = []
    for r in peaks:
        c = cost(r, base)
        logs.append(np.log(r.memory_gib / memory_gib(c)))
    pull = (RUN_SCATTER / PRIOR_SPREAD) ** 2
    mean = (weights @ np.array(logs) + pull * np.log1p(prior)) / (weights.sum() + pull)
    return float(np.clip(np.expm1(mean), lo, hi))


def fit(rows: list[TitanRow]) -> dict[str, float]:
    return {**fit_step(rows), MEMORY_CONSTANT[0]: fit_memory(rows)}


def errors(rows: list[TitanRow], constants: dict[str, float]) -> tuple[list[float], list[float]]:
    """(step-time errors of ``rows``, memory errors of those with a peak figure)."""
    step, memory = [], []
    for r in rows:
        c = cost(r, constants)
        step.append(c.step_time_s / r.measured_step_time_s - 1)
        if r.memory_is_peak:
            memory.append(memory_gib(c) / r.memory_gib - 1)
    return step, memory


def _summary(errs: list[float]) -> str:
    if not errs:
        return "-"
    a = np.abs(errs)
    return f"mean |error| {a.mean():.1%}, max {a.max():.1%} ({len(errs)} runs)"


def _constants_line(constants: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in constants.items())


def holdout() -> None:
    """Each source predicted by a fit on the other two; then all sources together."""
    sources = sorted({r.source for r in TABLE_H})
    step_all, memory_all = [], []
    for source in sources:
        train = [r for r in TABLE_H if r.source != source]
        test = [r for r in TABLE_H if r.source == source]
        constants = fit(train)
        step, memory = errors(test, constants)
        step_all += step
        memory_all += memory
        print(f"{source.split(',')[0]} held out:")
        print(f"  fitted on the other two: {_constants_line(constants)}")
        print(f"  step time {_summary(step)}; peak memory {_summary(memory)}")
    print(f"out of sample, all sources: step time {_summary(step_all)}; peak memory {_summary(memory_all)}")
    step, memory = errors(TABLE_H, in_code())
    print(f"in sample (the code's constants): step time {_summary(step)}; peak memory {_summary(memory)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holdout", action="store_true", help="predict each source from a fit on the other two")
    args = parser.parse_args()
    if args.holdout:
        holdout()
        return
    constants = fit(TABLE_H)
    step, memory = errors(TABLE_H, constants)
    print(f"fitted on all of table H: step time {_summary(step)}; peak memory {_summary(memory)}")
    print(f"  fit:     {_constants_line(constants)}")
    print(f"  in code: {_constants_line(in_code())}")


if __name__ == "__main__":
    main()
