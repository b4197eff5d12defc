"""torchrun's SIGTERM while a rank trains and while it reports (train/launch.py)."""

from __future__ import annotations

import os
import signal

import pytest

from ntp_planner.executor.parallel.comm import Terminated, lost_peer
from ntp_planner.executor.train.launch import _SigtermAsLostPeer


@pytest.fixture
def sigterm_kept():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_sigterm_while_training_is_a_lost_peer(sigterm_kept):
    """torchrun's agent stops the healthy ranks 0.1 s after one fails: each takes it as a lost
    peer, so it looks for the rank that failed instead of dying silently."""
    _SigtermAsLostPeer()
    with pytest.raises(Terminated) as caught:
        os.kill(os.getpid(), signal.SIGTERM)
    assert lost_peer(caught.value)


def test_sigterm_while_reporting_lets_the_report_finish(sigterm_kept):
    """A rank saying why the run failed is not cut short by the agent's SIGTERM, and keeps
    ignoring it after the run (the old handler is put back only on success)."""
    stopping = _SigtermAsLostPeer()
    stopping.reporting = True
    os.kill(os.getpid(), signal.SIGTERM)  # the default handler would end pytest here
    stopping.restore()
    os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)


def test_a_run_that_succeeded_puts_the_old_handler_back(sigterm_kept):
    def mine(signum, frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    _SigtermAsLostPeer().restore()
    assert signal.getsignal(signal.SIGTERM) is mine
