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

from cost_models.flops import head_ops, layer_ops
from cost_models.model import ModelSpec
from cost_models.training import TrainingSpec

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


# Which units an op's work is spread over when TP shrinks (flops.layer_ops / head_ops names):
# attention by heads, each MLP by its own columns, the LM head by vocabulary rows; the router is
# replicated on every TP rank (no share).
_UNITS = {
    "qkv": "heads",
    "attention-core": "heads",
    "attention-scores": "heads",
    "attention-values": "heads",
    "out-proj": "heads",
    "mlp-up": "ffn",
    "mlp-down": "ffn",
    "experts-up": "experts",
    "experts-down": "experts",
    "shared-expert-up": "shared",
    "shared-expert-down": "shared",
    "logits": "vocab",
    "router": None,
    # MLA (DeepSeek-V3): the down-projections to the latents are whole on every TP rank, the
    # up-projections per head
    "q-down": None,
    "kv-down": None,
    "q-up": "heads",
    "kv-up": "heads",
    "mtp-proj": None,
}


def _op_work(ops) -> dict[str | None, float]:
    """FLOPs of ``ops`` by the units they are spread over, each op paid fwd + bwd times (a GEMM
    3 times, flash attention 3.5: ``flops.Op``); memory-bound passes carry no FLOPs."""
    out: dict[str | None, float] = {}
    for op in ops:
        if op.kind in ("gemm", "flash"):
            unit = _UNITS[op.name]
            out[unit] = out.get(unit, 0.0) + op.flops * (op.fwd + op.bwd)
    return out


def replica_flops(model: ModelSpec, training: TrainingSpec, with_vocab: bool = False) -> dict[str, tuple[float, int]]:
    """(FLOPs per sequence of the whole model at TP 1, units they are spread over) by kind of
    unit, from the step estimator's own FLOP functions (``flops.layer_ops``, ``flops.head_ops``)
    summed over the model's layer kinds: an MoE model's dense prefix layers count their dense
    MLP (``ffn<width>``), its MoE layers their routed experts (top_k copies of every token), the
    shared expert and the router, replicated on every TP rank (``replicated``, one unit).

    >>> from cost_models import MODELS
    >>> {k: n for k, (_, n) in replica_flops(MODELS["llama3-8b"], TrainingSpec(seq_len=4096)).items()}
    {'heads': 32, 'ffn14336': 14336}
    """
    seq, flash = training.seq_len, training.flash_attention
    units = {
        "heads": model.num_heads,
        "experts": model.moe_ffn_hidden_size,
        "shared": model.moe_shared_ffn_hidden_size,
        "vocab": model.vocab_size,
        None: 1,
    }
    total: dict[tuple[str, int], float] = {}

    def add(unit: str | None, n: int, flops: float) -> None:
        key = (unit or "replicated", n)
        total[key] = total.get(key, 0.0) + flops

    for kind, count in model.kind_counts(0, model.num_layers).items():
        for unit, f in _op_work(layer_ops(model, kind, 1, seq, 1, 1, 1, False, flash)).items():
            if unit == "ffn":  # a dense MLP's columns: each width its own kind (pruned layers differ)
                add(f"ffn{kind.ffn}", kind.ffn, count * f)
            else:
                add(unit, units[unit], count * f)
    if with_vocab:
        for unit, f in _op_work(head_ops(model, 1, seq, 1, 1)).items():
            add(unit, units[unit], f)
    return {name: (f, n) for (name, n), f in total.items()}


def work_ratio(model: ModelSpec, training: TrainingSpec, full: int, reduced: int, with_vocab: bool = False) -> float:
    """How much longer the fullest GPU computes at ``reduced`` instead of ``full`` TP degree:

        sum_k F_k max_share(U_k, reduced) / sum_k F_k max_share(U_k, full)

    over the kinds k of ``replica_flops`` (F_k FLOPs spread over U_k units: heads, each MLP's
    columns, vocabulary rows on the first and last stage; the router is replicated, share 1). GPU
    0 holds the extra unit of every kind (``uneven_shares``), so it is the fullest for all at once.

    >>> from cost_models import MODELS
    >>> round(work_ratio(MODELS["llama3-8b"], TrainingSpec(seq_len=4096), 8, 7), 4)
    1.1706
    """
    kinds = replica_flops(model, training, with_vocab).values()
    work = [sum(f * max(uneven_shares(n, t)) / n for f, n in kinds) for t in (reduced, full)]
    return work[0] / work[1]


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


def degraded_breakdown(
    breakdown: dict[str, float],
    micro_batches: int,
    new_micro_batches: float,
    full: int,
    reduced: int,
    work: float,
    speed: float = 1.0,
) -> dict[str, float]:
    """The step breakdown (cost_models.step's terms) of a replica running at TP ``reduced``
    instead of ``full`` with ``new_micro_batches``, scaled from a healthy step's ``breakdown``:

    - per micro-batch, compute and recompute take ``work`` (``work_ratio``) times longer on the
      fullest GPU, divided by ``speed`` (power boost, ``speed_at_power``); TP collectives move
      ring_factor(n) of the same buffer; CP/EP/pipeline traffic is unchanged;
    - the pipeline bubble scales with the per-micro-batch time;
    - DP gradient sync and the optimizer scale with the parameters per GPU (``work``).

    This is the one cost of a degraded replica: the re-planner (``ntp_planner.failures.replan``,
    through ``degraded_step_time``) and the validate prediction (``executor.check.predict``) both
    take it.
    """
    m, new_m = micro_batches, new_micro_batches
    tp_scale = ring_factor(reduced) / ring_factor(full) if full > 1 else 1.0
    scale = {"compute": work / speed, "recompute": work / speed, "tp_comm": tp_scale}
    one = {k: breakdown[k] / m * scale.get(k, 1.0) for k in _PER_MICRO_BATCH}  # one micro-batch's
    per_mb, new_per_mb = sum(breakdown[k] for k in _PER_MICRO_BATCH) / m, sum(one.values())
    out = {k: new_m * v for k, v in one.items()}
    out["pp_bubble"] = breakdown["pp_bubble"] * (new_per_mb / per_mb if per_mb else 1.0)
    out["dp_comm_exposed"] = breakdown["dp_comm_exposed"] * work
    out["optimizer"] = breakdown["optimizer"] * work
    out["overhead"] = breakdown["overhead"]
    return out


_PER_MICRO_BATCH = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p")


def degraded_step_time(
    breakdown: dict[str, float],
    micro_batches: int,
    new_micro_batches: float,
    full: int,
    reduced: int,
    work: float,
    speed: float = 1.0,
) -> float:
    """Step time of a degraded replica: the sum of ``degraded_breakdown``."""
    return sum(degraded_breakdown(breakdown, micro_batches, new_micro_batches, full, reduced, work, speed).values())


def reshard_cost(
    weight_bytes: float, grad_bytes: float, full: int, reduced: int, bw_bytes_per_s: float, micro_batch_compute_s: float
) -> tuple[float, float, float]:
    """(bytes the busiest GPU sends, seconds one way, seconds hidden) of NTP's gradient reshard:
    healthy replicas reshard their gradients from ``full`` to the ``reduced`` degree inside their
    NVLink domain before the DP all-reduce (extra ranks send their slices to core ranks) and back
    after it; the busiest GPU moves its whole gradient shard each way. ``weight_bytes``: the
    16-bit primary weights of one GPU, 2 bytes per parameter (fp8_params stores GEMM weights in 1
    byte, so there this undercounts the parameters, at most by half). The way there hides behind
    the last micro-batch's backward, 2/3 of its compute (backward costs twice forward:
    ``cost_models.flops``).

    >>> reshard_cost(2e9, 4.0, 8, 6, 4e11, 0.3)  # 1e9 parameters: a 4e9-byte shard, sent whole by an extra rank
    (4000000000.0, 0.01, 0.01)
    """
    shard = weight_bytes / 2 * grad_bytes
    busiest = max(shard, shard * (full - reduced) / reduced)  # an extra rank sends all; a core rank (n-k)/k shares
    one_way = busiest / bw_bytes_per_s
    return busiest, one_way, min(one_way, micro_batch_compute_s * 2 / 3)
