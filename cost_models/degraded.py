"""What a replica costs when it runs at a reduced TP degree (NTP) or with boosted power.

Facts from the NTP paper (arXiv 2504.06095; shared/reference/ntp.md):
- A layer's units (attention heads, FFN columns, vocabulary rows) can be redistributed from N
  to n < N GPUs as long as a column-parallel column and its row-parallel row stay together; when
  n does not divide the units, GPUs hold uneven numbers and the fullest GPU sets the pace.
- Work per surviving GPU rises by about N/n; power boost can pay for it, but speed does not rise
  linearly with power: perf/W fell 2.8% at 1.1x power and 6.5% at 1.2x.
"""

from __future__ import annotations

import math

from cost_models.model import ModelSpec

# perf/W loss(p) = A (p - 1) + B (p - 1)^2 through the paper's two points: 2.8% at 1.1x, 6.5% at 1.2x.
_A, _B = 0.235, 0.45
# The largest power multiplier taken: no GPU board lets its power limit reach twice its default
# (an H100 SXM's default is its maximum, 700 W). The curve peaks at p = 1.4 (d/dp p (1 - A x - B x^2)
# = 1 - A (x + p) - B (x^2 + 2 p x) is 0.001 there) and falls past it, staying above 0 up to
# p = 2.25 (1 - A x - B x^2 = 0 at x = 1.25), so every multiplier up to this one has a speed.
MAX_POWER = 2.0


def uneven_shares(units: int, n: int) -> list[int]:
    """Units per GPU when ``units`` are spread over ``n`` GPUs as evenly as possible.

    >>> shares = uneven_shares(32, 30)
    >>> shares.count(2), shares.count(1)
    (2, 28)
    """
    if n < 1:
        raise ValueError(f"a TP group needs at least one GPU, got {n}")
    base, extra = divmod(units, n)
    return [base + 1] * extra + [base] * (n - extra)


def slowest_share_ratio(units: int, full: int, reduced: int) -> float:
    """Work of the fullest GPU at ``reduced`` GPUs over its work at ``full`` GPUs."""
    return max(uneven_shares(units, reduced)) / max(uneven_shares(units, full))


def work_ratio(model: ModelSpec, full: int, reduced: int, seq_len: int, with_vocab: bool = False) -> float:
    """How much longer the fullest GPU computes at ``reduced`` instead of ``full`` TP degree:
    the ratios of heads, FFN columns (and vocabulary rows, on the first and last stage) weighted
    by the FLOPs each kind of unit carries per token."""
    h = model.hidden_size
    attention = 2 * h * (model.q_width + 2 * model.kv_width) + 2 * model.q_width * h + 4 * seq_len * model.q_width
    width = model.moe_ffn_hidden_size * model.moe_top_k if model.is_moe else model.ffn_hidden_size
    units = model.moe_ffn_hidden_size if model.is_moe else model.ffn_hidden_size
    mlp = 2 * model.mlp_matrices * h * width
    parts = [
        (attention * model.num_layers, slowest_share_ratio(model.num_heads, full, reduced)),
        (mlp * model.num_layers, slowest_share_ratio(units, full, reduced)),
    ]
    if with_vocab:
        parts.append((2 * h * model.vocab_size, slowest_share_ratio(model.vocab_size, full, reduced)))
    total = sum(f for f, _ in parts)
    return sum(f * r for f, r in parts) / total


def speed_at_power(power: float) -> float:
    """Relative speed at ``power`` times nominal power: p * (1 - perf/W loss(p)).

    >>> round(speed_at_power(1.1), 4), round(speed_at_power(1.2), 4)
    (1.0692, 1.122)
    """
    if power <= 1:
        return power
    x = power - 1
    return power * (1 - _A * x - _B * x * x)


def power_for_speed(speed: float, max_power: float = 1.3) -> float:
    """The smallest power multiplier reaching ``speed`` (inverse of speed_at_power), or inf if
    even ``max_power`` cannot. The fitted curve is meant for boosts of tens of percent (it peaks
    near 1.4x); the study's racks allow +30% of TDP, the default ceiling.

    >>> round(power_for_speed(speed_at_power(1.2)), 9)
    1.2
    """
    if speed <= 1:
        return 1.0
    if speed_at_power(max_power) < speed:
        return math.inf
    lo, hi = 1.0, max_power
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speed_at_power(mid) < speed else (lo, mid)
    return hi


def ring_factor(n: int) -> float:
    """Bytes per GPU of a ring collective relative to the buffer: (n - 1) / n."""
    return (n - 1) / n if n > 1 else 0.0


def degraded_step_time(
    breakdown: dict[str, float],
    micro_batches: int,
    new_micro_batches: int,
    full: int,
    reduced: int,
    work: float,
    speed: float = 1.0,
) -> float:
    """Step time of a replica running at TP ``reduced`` instead of ``full`` with
    ``new_micro_batches``, scaled from a healthy step's breakdown (cost_models.step):

    - per micro-batch, compute and recompute take ``work`` times longer on the fullest GPU,
      divided by ``speed`` (power boost); TP collectives move ring_factor(n) of the same buffer;
      CP/EP/pipeline traffic is unchanged;
    - the pipeline bubble scales with the per-micro-batch time;
    - DP gradient sync and the optimizer scale with the parameters per GPU (``work``).
    """
    m = micro_batches
    comp = (breakdown["compute"] + breakdown["recompute"]) / m
    tp = breakdown["tp_comm"] / m
    other = (breakdown["cp_comm"] + breakdown["ep_comm"] + breakdown["pp_p2p"]) / m
    per_mb = comp + tp + other
    tp_scale = ring_factor(reduced) / ring_factor(full) if full > 1 else 1.0
    new_per_mb = comp * work / speed + tp * tp_scale + other
    bubble = breakdown["pp_bubble"] * (new_per_mb / per_mb if per_mb else 1.0)
    fixed = (breakdown["dp_comm_exposed"] + breakdown["optimizer"]) * work + breakdown["overhead"]
    return new_micro_batches * new_per_mb + bubble + fixed
