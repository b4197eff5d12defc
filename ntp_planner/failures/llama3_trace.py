"""A synthetic failure trace drawn from Llama 3's published interruption statistics, for the
README's ``ntp simulate --trace`` example and the tests: ``examples/llama3_trace.csv``.

Llama 3 405B's pretraining (arXiv 2407.21783, section 3.3.4, Table 5) saw 419 unexpected
interruptions in 54 days on 16,384 H100s (8 a host). The sample draws 419 failure times uniformly
over the 54 days (a Poisson process given its count), a cause per failure with the paper's shares
(``LLAMA3_SHARES``, as /work/shared/reference/failures.md lists them), the failed unit (a GPU,
or a host for network, NIC and host-maintenance causes) uniformly, and the repair from the
simulator's default law of the cause's class (hardware 3-5 days, software 3 hours). It is not
Meta's log: the paper publishes counts by cause, not when or where each failure struck.

Regenerate: ``python -m ntp_planner.failures.llama3_trace examples/llama3_trace.csv``.
"""

from __future__ import annotations

import sys

import numpy as np

from ntp_planner.failures.sim_config import DEFAULT_CLASSES
from ntp_planner.failures.trace import COLUMNS, HEADER_COMMENT, LLAMA3_CAUSES

# Percent of unexpected interruptions by cause (Llama 3, Table 5); "other" is the rest (SSD, power
# supply, chassis, dependencies, ...), each under 1%.
LLAMA3_SHARES = {
    "faulty-gpu": 30.1,
    "hbm3": 17.2,
    "sram": 4.5,
    "gsp": 4.1,
    "sdc": 1.4,
    "thermal": 1.4,
    "software-bug": 12.9,
    "network": 8.4,
    "host-maintenance": 7.6,
    "nic": 1.7,
    "nccl-watchdog": 1.7,
    "other": 9.0,
}
HOST_CAUSES = ("network", "host-maintenance", "nic")  # they take a host down, the rest one GPU
SAMPLE_SEED = 2407  # arXiv 2407.21783


def llama3_sample(
    rng: np.random.Generator, gpus: int = 16384, gpus_per_host: int = 8, days: float = 54, failures: int = 419
) -> str:
    """The synthetic trace's text: ``failures`` interruptions over ``days`` on ``gpus`` GPUs, times
    and repairs rounded to 0.001 h (3.6 s), labelled synthetic in its header."""
    names = list(LLAMA3_SHARES)
    share = np.array([LLAMA3_SHARES[c] for c in names]) / 100
    time_h = np.round(np.sort(rng.uniform(0, days * 24, size=failures)), 3)
    cause = rng.choice(len(names), size=failures, p=share / share.sum())
    gpu = rng.integers(0, gpus, size=failures)
    host = rng.integers(0, gpus // gpus_per_host, size=failures)
    law = {c.name: (c.repair_min_h, c.repair_max_h) for c in DEFAULT_CLASSES}
    lo, hi = np.array([law[LLAMA3_CAUSES[names[k]]] for k in cause]).T
    repair_h = np.round(rng.uniform(lo, hi), 3)
    lines = [
        f"# SYNTHETIC, not a real log: {failures} failures drawn (seed {SAMPLE_SEED}) from Llama 3's published "
        f"interruption counts ({failures} in {days:g} days on {gpus:,} GPUs, by cause),",
        "# by python -m ntp_planner.failures.llama3_trace; see that module for how.",
        HEADER_COMMENT.rstrip("\n"),
        ",".join(COLUMNS),
    ]
    for t, k, g, h, r in zip(time_h, cause, gpu, host, repair_h, strict=True):
        unit = f"host:{h}" if names[k] in HOST_CAUSES else f"gpu:{g}"
        lines.append(f"{t:.3f},{unit},{names[k]},{r:.3f}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from ntp_planner.outputs import check_output, write_atomic

    if len(sys.argv) != 2:
        sys.exit("usage: python -m ntp_planner.failures.llama3_trace OUT.csv (the sample is examples/llama3_trace.csv)")
    path = check_output(sys.argv[1], "", example="llama3_trace.csv")
    write_atomic(path, llama3_sample(np.random.default_rng(SAMPLE_SEED)))
