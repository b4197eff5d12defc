"""benchmarks/calibration.py's diagnostics: the least summed error by one number, and what a
correction fitted afterwards per model (or model and GPU) would leave of a table."""

import doctest
import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("calibration", ROOT / "benchmarks" / "calibration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(model: str, gpu: str, err: float):
    run = SimpleNamespace(model=SimpleNamespace(name=model), cluster=SimpleNamespace(gpu=SimpleNamespace(name=gpu)))
    return run, None, err


def test_least_summed_error_examples():
    module = _load()
    assert doctest.testmod(module, verbose=False).failed == 0
    # p = 2 over (1, 2, 2): 1 + 0 + 0 = 1; p = 1: 0 + 0.5 + 0.5 = 1; both 1.0
    assert module.least_summed_error([1.0, 2.0, 2.0]) == 1.0


def test_oracle_removes_a_level_per_group_but_not_the_spread_inside_it():
    module = _load()
    # model a: +25% on X and on Y, so the factor 0.8 zeroes both. Model b: errors 0 and -50%
    # (predicted / measured 1 and 0.5); factor 1 leaves 0 + 0.5, factor 2 leaves 1 + 0: 0.5 over
    # the table's 4 runs is 12.5%
    rows = [_row("a", "X", 0.25), _row("a", "Y", 0.25), _row("b", "X", 0.0), _row("b", "Y", -0.5)]
    lines = module.oracle_lines("G", rows)
    assert lines[1] == "- one free factor per model (2 groups): mean |error| 12.50%"
    # per model x GPU every group has one run: a free factor zeroes each
    assert lines[2] == "- one free factor per model x GPU (4 groups): mean |error| 0.00%"
    assert module.oracle_lines("A", rows) == []  # tables of a few runs per model print none
