"""The alpha-beta fit of measured collectives: ``time_s = alpha_s + bytes / bw_bytes_per_s`` per
operation and group size, the form of every term in ``cost_models.collectives``. Pure numpy.

Least squares on the *relative* error, so a 1 KB message (microseconds) weighs as much as a
64 MB one (tens of milliseconds): dividing each equation ``alpha + beta x_i = t_i`` by ``t_i``
gives rows ``[1/t_i, x_i/t_i] . [alpha, beta] = 1``. A negative intercept (noise on small
messages) is refitted with alpha = 0; a slope at or below zero (every size took the same time)
keeps the fastest rate the schema admits, 1e15 bytes/s, so the fit says "latency only".
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from cost_models.profile import CollectiveFit, CollectiveTime

MAX_BW_BYTES_PER_S = 1e15


def fit_alpha_beta(points: Iterable[tuple[float, float]]) -> tuple[float, float, float]:
    """(alpha_s, bw_bytes_per_s, max_rel_residual) of (bytes, seconds) points.

    >>> a, bw, r = fit_alpha_beta([(x, 1e-5 + x / 1e9) for x in (1e3, 1e5, 1e7)])
    >>> round(a * 1e6, 6), round(bw / 1e9, 6), r < 1e-9
    (10.0, 1.0, True)
    """
    pts = np.array(sorted(points), dtype=float)
    if len(pts) < 2:
        raise ValueError(f"an alpha-beta fit needs two message sizes or more, got {len(pts)}")
    x, t = pts[:, 0], pts[:, 1]
    rows = np.stack([1 / t, x / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(rows, np.ones_like(t), rcond=None)
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
    beta = max(beta, 1 / MAX_BW_BYTES_PER_S)
    residual = np.abs(alpha + beta * x - t) / t
    return float(alpha), float(1 / beta), float(residual.max())


def fit_collectives(times: Iterable[CollectiveTime]) -> list[CollectiveFit]:
    """One fit per (operation, group size) with two message sizes or more, in the order first measured."""
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for c in times:
        groups.setdefault((c.op, c.group_size), []).append((c.bytes, c.time_s))
    out = []
    for (op, g), points in groups.items():
        if len(points) < 2:
            continue
        alpha, bw, residual = fit_alpha_beta(points)
        out.append(CollectiveFit(op=op, group_size=g, alpha_s=alpha, bw_bytes_per_s=bw, max_rel_residual=residual))
    return out
