"""The alpha-beta fit recovers known latency and bandwidth, on relative error."""

import numpy as np
import pytest

from cost_models.profile import CollectiveTime
from ntp_planner.profiler.fit import MAX_BW_BYTES_PER_S, fit_alpha_beta, fit_collectives

SIZES = [2**k for k in range(10, 27, 2)]  # 1 KB .. 64 MB


def test_recovers_alpha_and_bandwidth_exactly():
    alpha, bw, residual = fit_alpha_beta([(x, 25e-6 + x / 3e9) for x in SIZES])
    assert alpha == pytest.approx(25e-6, rel=1e-9)
    assert bw == pytest.approx(3e9, rel=1e-9)
    assert residual < 1e-9


def test_recovers_them_within_noise_and_reports_the_worst_residual():
    rng = np.random.default_rng(0)
    noise = 1 + rng.uniform(-0.05, 0.05, len(SIZES))
    alpha, bw, residual = fit_alpha_beta([(x, (40e-6 + x / 1e10) * e) for x, e in zip(SIZES, noise, strict=True)])
    assert alpha == pytest.approx(40e-6, rel=0.1)
    assert bw == pytest.approx(1e10, rel=0.1)
    assert 0.01 < residual < 0.1


def test_relative_error_weighs_small_messages():
    """An absolute least-squares fit would ignore the microsecond points; this one keeps alpha."""
    points = [(x, 10e-6 + x / 1e9) for x in SIZES]
    points[-1] = (points[-1][0], points[-1][1] * 1.2)  # one large message 20% slow
    alpha, _, _ = fit_alpha_beta(points)
    assert alpha == pytest.approx(10e-6, rel=0.05)


def test_negative_intercept_is_refitted_at_zero_and_a_flat_slope_is_latency_only():
    # x/t = 2e9, 1e9, 1e9 B/s: a negative intercept; with alpha = 0, beta = sum(x/t) / sum((x/t)^2)
    # = 4e9 / 6e18, so bw = 1.5e9
    alpha, bw, _ = fit_alpha_beta([(1e3, 0.5e-6), (1e6, 1e-3), (1e7, 1e-2)])
    assert alpha == 0.0 and bw == pytest.approx(1.5e9, rel=1e-9)
    alpha, bw, _ = fit_alpha_beta([(1e3, 5e-5), (1e6, 5e-5)])
    assert alpha == pytest.approx(5e-5) and bw == pytest.approx(MAX_BW_BYTES_PER_S)


def test_one_fit_per_operation_and_group_size():
    times = [
        CollectiveTime(op=op, group_size=g, bytes=x, time_s=g * 1e-5 + x / 1e9)
        for op in ("all_reduce", "send_recv")
        for g in (2, 4)
        for x in (1e3, 1e6)
    ] + [CollectiveTime(op="all_gather", group_size=2, bytes=1e3, time_s=1e-5)]  # one size: no fit
    fits = fit_collectives(times)
    assert [(f.op, f.group_size) for f in fits] == [
        ("all_reduce", 2),
        ("all_reduce", 4),
        ("send_recv", 2),
        ("send_recv", 4),
    ]
    assert fits[1].alpha_s == pytest.approx(4e-5)
