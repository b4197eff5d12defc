"""Every holder of every parameter, compared with the reference.

A parameter lives on many ranks: every TP rank holds a replicated one (norms), every owner holds
a KV head cut by an uneven split, every copy of a lower-degree block holds its slices (in-stage
data parallelism), every replica holds its own. Each of them must end with the same values and
the same synced first-step gradient as the reference, so each is compared: a bug confined to
copy 1, to TP rank 2's copy of a norm or to one replica is named where it lives.

Each rank describes what it holds (``holdings``: per parameter its name, where it sits, which
indices of the full tensor it holds and its values), rank 0 gathers them (one message per rank)
and compares each with the same indices of the reference (``compare``). A holder's error is
normwise and relative to the whole reference tensor, ``|got - ref[idx]| / |ref|``: slices of
one tensor then add up to the tensor's error (their squares do), so a slice never looks worse
than it is because it is small, and a wrong slice of any size shows its share of the tensor.

A value that is not finite (NaN or inf) in a holding, or in the reference, is an infinite error
named with its holder, never skipped: NaN compares false with everything, so a scan by ``>=``
would pass it by (``finite_error``).
"""

from __future__ import annotations

import math

import torch

from ntp_planner.executor.model.moe import EXPERT_KEYS
from ntp_planner.executor.parallel.tensor import param_index
from ntp_planner.executor.spec import RunSpec


def holdings(model, spec: RunSpec, rank: int, first_grads: list[torch.Tensor] | None) -> list[dict]:
    """This rank's parameters (after training) and their first-step gradients (``first_grads``,
    in ``model.named_parameters()`` order), on the CPU, each with where it is held and the
    (dimension, indices) cuts of the full tensor it holds (none: all of it)."""
    replica, stage = spec.locate(rank)
    out = []
    params = list(model.named_parameters())
    grads = [None] * len(params) if first_grads is None else first_grads  # None: no step ran (live recovery)
    for (name, key, bs, p), grad in zip(params, grads, strict=True):
        out.append(
            {
                "name": name,
                "rank": rank,
                "replica": replica,
                "stage": stage,
                "copy": bs.copy,
                "tp_rank": bs.tp_rank,
                "index": _index(model, spec, key, bs),
                "param": p.detach().cpu().clone(),
                "grad": grad,
            }
        )
    return out


def where(h: dict) -> str:
    """'rank 5 (replica 1, stage 0, copy 1, TP rank 0)': where a holding lives."""
    return f"rank {h['rank']} (replica {h['replica']}, stage {h['stage']}, copy {h['copy']}, TP rank {h['tp_rank']})"


def _index(model, spec: RunSpec, key: str, bs) -> list[tuple[int, list[int]]]:
    """The (dimension, indices) cuts of the full tensor a holding is: its TP slice, and under
    expert parallelism the experts its EP rank owns (``moe.local_experts``)."""
    if key not in EXPERT_KEYS:
        idx = param_index(spec.cfg, key, bs.block.degree, bs.tp_rank)
        return [] if idx is None else [idx]
    idx = param_index(spec.cfg, key, *model.expert_cut(bs.block.degree, bs.tp_rank))
    return [(0, list(model.seat.mine)), *([] if idx is None else [idx])]


def _slice(full: torch.Tensor, index: list[tuple[int, list[int]]]) -> torch.Tensor:
    for dim, rows in index:
        full = full.index_select(dim, torch.tensor(rows))
    return full


def finite_error(err: float) -> float:
    """``err``, or inf when it is NaN: a comparison involving a NaN is the worst there is.

    >>> finite_error(1e-15), finite_error(float("nan")), max(0.0, finite_error(float("nan")))
    (1e-15, inf, inf)
    """
    return math.inf if math.isnan(err) else err


def loss_errors(losses: list[float], reference: list[float]) -> float:
    """The largest relative error of a run's losses against the reference's, inf when either has
    a non-finite loss (or the two differ in length: a step lost or applied twice).

    >>> loss_errors([2.0, 1.0], [2.0, 1.0 + 1e-12]) < 1e-11, loss_errors([2.0, float("nan")], [2.0, 1.0])
    (True, inf)
    """
    if len(losses) != len(reference):
        return math.inf
    errs = [abs(a - b) / max(abs(b), 1e-300) for a, b in zip(losses, reference, strict=True)]
    errs += [math.inf for v in (*losses, *reference) if not math.isfinite(v)]
    return max((finite_error(e) for e in errs), default=0.0)


def non_finite_losses(losses: list[float], reference: list[float]) -> list[str]:
    """A sentence for each step whose loss is not finite, in the run or in the reference."""
    out = [f"the loss of step {i} is {v} in the run" for i, v in enumerate(losses, 1) if not math.isfinite(v)]
    return out + [f"the loss of step {i} is {v} in the reference" for i, v in enumerate(reference, 1)
                  if not math.isfinite(v)]  # fmt: skip


def compare(held: list[dict], ref_params: dict, ref_grads: dict, noise: frozenset[str] = frozenset()) -> dict:
    """Errors of every holding against the reference: the worst parameter and gradient (with
    where they are held), the largest elementwise parameter error (over max |ref|), and the
    worst parameter error of each pipeline (replica, or its cp slice). Parameters in ``noise``
    have no gradient in exact arithmetic: their values are not compared and their gradient's
    error is taken over the largest reference gradient. ``problems``: a sentence for each tensor
    holding a value that is not finite (the first holder of each), which fails the run."""
    worst = {"param": (-1.0, None), "grad": (-1.0, None)}
    elementwise, per_pipeline, problems = 0.0, {}, {}
    largest_grad = max((torch.linalg.norm(v) for v in ref_grads.values()), default=torch.tensor(1.0))
    for h in held:
        for kind, ref in (("param", ref_params), ("grad", ref_grads)):
            if (kind == "param" and h["name"] in noise) or h[kind] is None:
                continue
            full = ref[h["name"]]
            got, want = h[kind].to(full.dtype), _slice(full, h["index"])
            if got.shape != want.shape:
                raise AssertionError(f"{h['name']} on {where(h)}: shape {tuple(got.shape)} != {tuple(want.shape)}")
            scale = largest_grad if h["name"] in noise else torch.linalg.norm(full)
            err = finite_error((torch.linalg.norm(got - want) / scale.clamp_min(1e-30)).item())
            for side, values in (("run", got), ("reference", want)):
                if not bool(torch.isfinite(values).all()):
                    err = math.inf
                    what = "gradient" if kind == "grad" else "value"
                    at = where(h) if side == "run" else f"the reference (the part {where(h)} holds)"
                    problems.setdefault((kind, h["name"], side), f"{h['name']}'s {what} is not finite on {at}")
            if err > worst[kind][0] or (err == worst[kind][0] and worst[kind][0] < math.inf):
                worst[kind] = (err, h)
            if kind == "param":
                per_pipeline[h["replica"]] = max(per_pipeline.get(h["replica"], 0.0), err)
                scale = full.abs().max().clamp_min(1e-30)
                elementwise = max(elementwise, finite_error(((got - want).abs().max() / scale).item()))
    (p_err, p_at), (g_err, g_at) = worst["param"], worst["grad"]
    return {
        "max_rel_error_params": max(p_err, 0.0),
        "worst_param": "" if p_at is None else p_at["name"],
        "worst_param_holder": "no parameter compared" if p_at is None else where(p_at),
        # a live run whose last generation ran no step (a rank failed in the final gather) holds no
        # synced gradients to compare: none is compared, and the holder says so
        "max_rel_error_grads": max(g_err, 0.0),
        "worst_grad": "" if g_at is None else g_at["name"],
        "worst_grad_holder": "no holding carries a gradient" if g_at is None else where(g_at),
        "max_elementwise_error_params": elementwise,
        "per_replica_error": [per_pipeline[r] for r in sorted(per_pipeline)],
        "holdings_compared": len(held),
        "problems": list(problems.values()),
    }
