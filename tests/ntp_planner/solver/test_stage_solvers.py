"""The graph solver, the MILP and brute force find the same optimum on random chains."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ntp_planner.solver.stage_solvers import ChainProblem, solve_graph, solve_milp

DEGREES = (1, 2, 4, 8)


def brute_force(p: ChainProblem):
    best = None
    for degrees in itertools.product(*[sorted(t) for t in p.time_s]):
        if p.fits(p.memory(degrees)) and (best is None or p.objective(degrees) < best[0]):
            best = (p.objective(degrees), degrees)
    return best


@st.composite
def chains(draw, free_switches=False):
    n = draw(st.integers(1, 8))
    pos = st.floats(0.01, 10.0, allow_nan=False)
    time_s, memory = [], []
    for _ in range(n):
        degrees = draw(st.sets(st.sampled_from(DEGREES), min_size=1))
        time_s.append({t: draw(pos) for t in degrees})
        memory.append({t: draw(pos) for t in degrees})
    switch = {} if free_switches else {(a, b): draw(pos) for a in DEGREES for b in DEGREES if a != b}
    return time_s, memory, switch


@settings(max_examples=60, deadline=None)
@given(chains())
def test_graph_milp_and_brute_force_agree_without_memory(chain):
    time_s, memory, switch = chain
    p = ChainProblem(tuple(time_s), tuple(memory), switch)
    expected, _ = brute_force(p)
    assert solve_graph(p).time_s == pytest.approx(expected, rel=1e-9)
    assert solve_milp(p).time_s == pytest.approx(expected, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(chains(), st.floats(0.2, 0.9), st.booleans())
def test_milp_and_brute_force_agree_with_binding_memory(chain, squeeze, free):
    time_s, memory, switch = chain
    lo = sum(min(m.values()) for m in memory)
    hi = sum(max(m.values()) for m in memory)
    p = ChainProblem(tuple(time_s), tuple(memory), {} if free else switch, budget_bytes=lo + squeeze * (hi - lo))
    expected = brute_force(p)
    got = solve_milp(p)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.time_s == pytest.approx(expected[0], rel=1e-9)
        assert got.memory_bytes <= p.budget_bytes * (1 + 1e-9)


def test_identical_blocks_share_count_variables_without_changing_the_answer():
    # 6 identical blocks, degree 1 fast but heavy, degree 8 slow but light; the budget allows
    # exactly two at degree 1: any two of them, so the count model must match brute force.
    p = ChainProblem(({1: 1.0, 8: 3.0},) * 6, ({1: 5.0, 8: 1.0},) * 6, budget_bytes=14.0)
    got = solve_milp(p)
    assert sorted(got.degrees) == [1, 1, 8, 8, 8, 8]
    assert got.time_s == brute_force(p)[0] == 2 * 1.0 + 4 * 3.0


def test_infeasible_budget_returns_none_and_graph_ignores_memory():
    p = ChainProblem(({1: 1.0, 2: 2.0},), ({1: 5.0, 2: 4.0},), budget_bytes=3.0)
    assert solve_milp(p) is None
    assert solve_graph(p).degrees == (1,)


def test_bad_problem_shapes():
    with pytest.raises(ValueError, match="same non-empty set of degrees"):
        ChainProblem(({1: 1.0},), ({2: 1.0},))
    assert math.isinf(ChainProblem(({1: 1.0},), ({1: 1.0},)).budget_bytes)


@settings(max_examples=60, deadline=None)
@given(chains(free_switches=True), st.floats(0.2, 0.9), st.integers(1, 3))
def test_count_enumeration_agrees_with_milp_and_brute_force(chain, squeeze, repeat):
    from ntp_planner.solver.stage_solvers import solve_counts

    time_s, memory, _ = chain
    time_s, memory = time_s * repeat, memory * repeat  # repeated blocks form groups
    lo = sum(min(m.values()) for m in memory)
    hi = sum(max(m.values()) for m in memory)
    p = ChainProblem(tuple(time_s), tuple(memory), budget_bytes=lo + squeeze * (hi - lo))
    got, milp = solve_counts(p), solve_milp(p)
    if len(time_s) <= 8:
        expected = brute_force(p)
        assert (got is None) == (expected is None)
        if expected:
            assert got.time_s == pytest.approx(expected[0], rel=1e-9)
    assert (got is None) == (milp is None)
    if got:
        assert got.time_s == pytest.approx(milp.time_s, rel=1e-9)
        assert got.memory_bytes <= p.budget_bytes * (1 + 1e-9)
