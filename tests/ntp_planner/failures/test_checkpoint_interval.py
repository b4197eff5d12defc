"""Checkpoint intervals and the closed forms the simulator is checked against, pinned to numbers
worked out by hand (the working is in each comment)."""

import pytest

from ntp_planner.failures.checkpoint_interval import daly_interval_s, interval_s, meta_ettr, young_interval_s


def test_young_interval_by_hand():
    # sqrt(2 x 50 s x 10,000 s) = sqrt(1e6) = 1,000 s
    assert young_interval_s(50, 10_000) == pytest.approx(1000)


def test_daly_interval_by_hand():
    # delta = 50 s, M = 10,000 s: x = delta / 2M = 1/400, sqrt(x) = 1/20;
    # 1,000 x (1 + 1/60 + 1/3,600) - 50 = 1,000 + 16.667 + 0.278 - 50 = 966.944 s
    assert daly_interval_s(50, 10_000) == pytest.approx(966.9444, abs=1e-3)
    # a write of 300 s at Llama 3's job MTBF: 419 failures in 54 days -> 54 x 24 x 3,600 / 419
    # = 11,135.08 s; Young gives sqrt(2 x 300 x 11,135.08) = 2,584.77 s, x = 0.013471, the
    # bracket 1 + 0.116065 / 3 + 0.013471 / 9 = 1.040185, so 2,584.77 x 1.040185 - 300 = 2,388.64 s
    assert daly_interval_s(300, 54 * 24 * 3600 / 419) == pytest.approx(2388.64, abs=0.01)


def test_daly_interval_when_the_write_outlasts_two_mtbfs():
    # delta >= 2M: checkpoint once per MTBF (Daly 2006)
    assert daly_interval_s(100, 40) == 40
    assert daly_interval_s(80, 40) == 40


def test_meta_ettr_by_hand():
    # n r = 1e-4 /s, restart 600 s, interval 3,000 s, write 300 s:
    # (1 - 1e-4 x (600 + 1,500)) / (1 + 300 / 3,000) = 0.79 / 1.1 = 0.71818
    assert meta_ettr(1e-4, 600, 3000, 300) == pytest.approx(0.718182, abs=1e-6)
    # no failures: only the writes cost, 3,000 / 3,300
    assert meta_ettr(0, 600, 3000, 300) == pytest.approx(10 / 11)


def test_interval_chosen_for_a_run():
    assert interval_s(1800, 300, 1.0, 86400) == 1800  # configured wins
    assert interval_s(None, 300, 0.0, 86400) == 86400  # no failures: one checkpoint, at the end
    # 0.36 failures an hour: MTBF 10,000 s; write 50 s -> Daly's 966.944 s
    assert interval_s(None, 50, 0.36, 86400) == pytest.approx(966.9444, abs=1e-3)
