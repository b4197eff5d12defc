"""The exactness check's verdict: what `ntp validate` prints (a rich view) and its `--json`.
Nothing here prints; the CLI does."""

from __future__ import annotations

import math

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ntp_planner.plan import Plan
from ntp_planner.views.model import params_json, params_text


def validate_json(shrunk, result, tolerance: float, backend: str, cuts: list[dict] | None = None, model=None) -> dict:
    """What `ntp validate --json` prints. ``cuts``: the shard cuts against the planner's shares
    (``executor.cuts.compare_cuts``); a mismatch fails the run. ``model``: the plan's model (the
    run executes a shrunk one), whose parameter counts come first."""
    spec = shrunk.spec
    errors = (result.max_rel_error_loss, result.max_rel_error_grads, result.max_rel_error_params)
    ranks = []
    for process, (plan_rank, gpu) in enumerate(shrunk.plan_ranks):
        replica, stage = spec.locate(process)
        local = spec.replicas[replica].stages[stage].ranks.index(process)
        ranks.append(
            {"process": process, "plan_rank": plan_rank, "gpu": gpu, "replica": replica, "stage": stage, "local": local}
        )
    return {
        **(params_json(model) if model is not None else {}),
        # NaN <= tolerance is false, so a NaN error fails too; a non-finite error prints as null
        "passed": max(errors) <= tolerance and all(c["match"] for c in cuts or []) and not result.problems,
        "problems": list(result.problems),
        "tolerance": tolerance,
        "dtype": spec.dtype,
        "max_rel_error_loss": _finite(result.max_rel_error_loss),
        "max_rel_error_grads": _finite(result.max_rel_error_grads),
        "max_rel_error_params": _finite(result.max_rel_error_params),
        "worst_param": result.worst_param,
        "worst_param_holder": result.worst_param_holder,
        "worst_grad": result.worst_grad,
        "worst_grad_holder": result.worst_grad_holder,
        "holdings_compared": result.holdings_compared,
        "cuts_match": all(c["match"] for c in cuts or []),
        "cuts": cuts or [],
        "vocabulary_ids_missing": result.vocab_ids_missing,
        "max_rel_error_params_per_pipeline": [_finite(e) for e in result.per_replica_error],
        "max_elementwise_error_params": _finite(result.max_elementwise_error_params),
        "step_time_s": result.step_time_s,
        "step_time_median_s": result.step_time_median_s,
        "time_split_s": result.time_split_s,
        "stage_step_time_s": result.stage_step_time_s,
        "stage_memory_bytes": result.stage_memory_bytes,
        "wall_s": result.wall_s,
        "losses": [_finite(v) for v in result.losses],
        "reference_losses": [_finite(v) for v in result.reference_losses],
        "backend": backend,
        "processes": spec.world_size,
        "steps": spec.steps,
        "seq_len": spec.seq_len,
        "micro_batch": spec.micro_batch,
        "vpp": spec.vpp,
        "ep": spec.ep,
        # per run stage, the EP groups and each expert's holders (processes) when the run hosts a re-plan's experts
        "expert_hosting": [
            {"stage": s, "groups": [list(g) for g in h.groups], "owners": [list(o) for o in h.owners]}
            for s, h in enumerate(spec.hosting)
        ],
        "zero": spec.zero,
        "plan_replicas": list(shrunk.replicas),
        "plan_stages": [list(g) for g in shrunk.stage_groups],
        "notes": list(spec.notes),
        "ranks": ranks,
    }


def _finite(x: float) -> float | None:
    """``x``, or None (JSON null) when it is NaN or infinite: JSON has no such numbers."""
    return x if math.isfinite(x) else None


def _error_text(x: float) -> str:
    """'3.1e-15', or 'not finite' for a NaN or infinite error (the problems say where)."""
    return f"{x:.1e}" if math.isfinite(x) else "not finite"


def validate_view(plan: Plan, shrunk, result, tolerance: float, backend: str, cuts: list[dict] | None = None) -> Group:
    """The run as executed, the losses step by step, the errors and the verdict."""
    data = validate_json(shrunk, result, tolerance, backend, cuts)
    spec = shrunk.spec
    head = Table(show_header=False, box=None)
    head.add_row("plan", escape(plan.layout.describe()))
    head.add_row("model", escape(params_text(plan.model)))
    shape = "; ".join(
        f"replica {i}: {' | '.join(_stage_text(st) for st in rep.stages)} x {rep.micro_batches} micro-batches"
        for i, rep in enumerate(spec.replicas)
    )
    head.add_row("ran", f"{spec.world_size} processes ({backend}), {escape(shape)}")
    for note in spec.notes:
        head.add_row("", escape(note))
    losses = Table(title="Loss per step", box=box.SIMPLE_HEAD)
    for col in ("step", "distributed", "one process", "relative error"):
        losses.add_column(col, justify="right")
    for i, (a, b) in enumerate(zip(result.losses, result.reference_losses, strict=True), 1):
        losses.add_row(str(i), f"{a:.7f}", f"{b:.7f}", _error_text(abs(a - b) / abs(b) if b else math.inf))
    verdict = Table(show_header=False, box=None)
    verdict.add_row("max relative error, loss", _error_text(result.max_rel_error_loss))
    verdict.add_row(
        "max relative error, first-step gradients",
        f"{_error_text(result.max_rel_error_grads)} ({result.worst_grad} on {result.worst_grad_holder})",
    )
    verdict.add_row(
        "max relative error, parameters",
        f"{_error_text(result.max_rel_error_params)} ({result.worst_param} on {result.worst_param_holder})",
    )
    verdict.add_row("compared", f"{result.holdings_compared} holdings (every rank's copy of every parameter)")
    if cuts is not None:
        verdict.add_row("shard cuts", _cuts_text(cuts))
    missing = result.vocab_ids_missing
    verdict.add_row(
        "vocabulary",
        f"all {spec.cfg.vocab} ids an input and a target"
        if not missing
        else Text(f"{missing} of {spec.cfg.vocab} ids missing as input or target: lengthen --seq-len", style="yellow"),
    )
    verdict.add_row("step time (slowest rank)", f"{result.step_time_s:.3f} s")
    for problem in result.problems:
        verdict.add_row("problem", Text(problem, style="red"))
    ok = data["passed"]
    fail = f"FAIL (above {tolerance:g})" if data["cuts_match"] else "FAIL (shard cuts differ from the planner's)"
    fail = f"FAIL ({result.problems[0]})" if result.problems else fail
    verdict.add_row(
        "verdict",
        Text(f"PASS ({spec.dtype}, all <= {tolerance:g})" if ok else fail, style="green" if ok else "red"),
    )
    return Group(head, losses, verdict)


def _cuts_text(cuts: list[dict]) -> str:
    """'as the planner deals them (heads, kv_heads, ffn at degree 3, 4; vocab at 4)', or the mismatches."""
    bad = [c for c in cuts if not c["match"]]
    if bad:
        return "; ".join(
            f"{c['unit']} at degree {c['degree']}: ran {'/'.join(map(str, c['executor']))}, "
            f"planned {'/'.join(map(str, c['planner']))}"
            for c in bad
        )
    by_unit: dict[str, list[str]] = {}
    for c in cuts:
        by_unit.setdefault(c["unit"], []).append(str(c["degree"]))
    groups: dict[str, list[str]] = {}
    for unit, degrees in by_unit.items():
        groups.setdefault(", ".join(degrees), []).append(unit)
    return "as the planner deals them (" + "; ".join(f"{', '.join(u)} at degree {d}" for d, u in groups.items()) + ")"


def _stage_text(stage) -> str:
    """'8 ranks: 4,2,4' - a stage's width and its blocks' degrees, runs collapsed."""
    degrees = [b.degree for b in stage.blocks]
    runs = [str(d) for i, d in enumerate(degrees) if i == 0 or degrees[i - 1] != d]
    return f"{stage.width} ranks: TP {','.join(runs)}"
