"""The executor's shard cuts set against the planner's shares of the plan's real model.

The exactness check compares the executor with one process, which has no cuts: it cannot tell
whether the executor deals heads, KV heads, FFN columns and vocabulary rows as the planner
assumed. The planner (``cost_models.degraded``) gives ``uneven_shares(units, t)`` units to the
ranks of a degree-``t`` group, fuller ranks first, and a rank needs the KV heads of its query
heads (for degrees that divide the KV heads, or that they divide, that is
``cost_models.flops.kv_heads_per_rank``). The shrunk run keeps the heads and KV heads and the
FFN width and vocabulary modulo every degree (``shrink``), so its shares must differ from the
planner's by the same number on every rank: the same ranks fuller, by the same amounts.

Worked example: Llama-3-8B (32 heads, 8 KV heads, FFN 14336) at degree 3 deals heads 11/11/10;
its KV groups of 4 heads are cut, so the ranks need 3/4/3 KV heads; FFN 4779/4779/4778.

>>> from cost_models.catalogue import resolve_model
>>> row = planner_shares(resolve_model("llama3-8b"), 3)
>>> row["heads"], row["kv_heads"], row["ffn"]
([11, 11, 10], [3, 4, 3], [4779, 4779, 4778])
"""

from __future__ import annotations

from cost_models.degraded import uneven_shares
from cost_models.model import ModelSpec
from ntp_planner.executor.parallel.ownership import layer_shards, vocab_shards
from ntp_planner.executor.spec import RunSpec

LAYER_UNITS = ("heads", "kv_heads", "ffn")


def planner_shares(model: ModelSpec, degree: int) -> dict[str, list[int]]:
    """Units per rank of a degree-``degree`` group of the real model, as the planner deals them."""
    heads = uneven_shares(model.num_heads, degree)
    group = model.num_heads // model.num_kv_heads
    kv, start = [], 0
    for n in heads:  # contiguous query heads; a KV head for every group they touch
        kv.append(len({h // group for h in range(start, start + n)}))
        start += n
    return {
        "heads": heads,
        "kv_heads": kv,
        "ffn": uneven_shares(model.ffn_hidden_size, degree),
        "vocab": uneven_shares(model.vocab_size, degree),
    }


def executor_shares(spec: RunSpec, degree: int) -> dict[str, list[int]]:
    """Units per rank of a degree-``degree`` group of the run, as ``ownership`` deals them."""
    cfg = spec.cfg
    sh = layer_shards(cfg.heads, cfg.kv_heads, cfg.ffn, degree)
    return {
        "heads": [len(h) for h in sh.heads],
        "kv_heads": [len(k) for k in sh.kv_heads],
        "ffn": [b - a for a, b in sh.ffn],
        "vocab": [b - a for a, b in vocab_shards(cfg.vocab, degree)],
    }


def compare_cuts(spec: RunSpec, model: ModelSpec) -> list[dict]:
    """One row per unit and degree the run uses (layers' degrees for heads, KV heads and FFN;
    the embedding's and LM head's for the vocabulary): both shares and whether they match."""
    used: dict[str, set[int]] = {u: set() for u in (*LAYER_UNITS, "vocab")}
    for rep in spec.replicas:
        for st in rep.stages:
            for b in st.blocks:
                for unit in LAYER_UNITS if b.kind == "layer" else ("vocab",):
                    used[unit].add(b.degree)
    rows = []
    for unit, degrees in used.items():
        for t in sorted(degrees):
            ran, planned = executor_shares(spec, t)[unit], planner_shares(model, t)[unit]
            offsets = {a - b for a, b in zip(ran, planned, strict=True)}
            rows.append({"unit": unit, "degree": t, "executor": ran, "planner": planned, "match": len(offsets) == 1})
    return rows


def mismatches(rows: list[dict]) -> str:
    """The rows that do not match, in one sentence ('' when all match)."""
    bad = [
        f"{r['unit']} at degree {r['degree']}: executor {'/'.join(map(str, r['executor']))}, "
        f"planner {'/'.join(map(str, r['planner']))}"
        for r in rows
        if not r["match"]
    ]
    if not bad:
        return ""
    return "the executor's shard cuts differ from the planner's shares (" + "; ".join(bad) + ")"
