"""Rich renderables for the CLI. Nothing here prints; cli.py does."""

from __future__ import annotations

import math

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cost_models.model import ModelSpec
from cost_models.step import StepCost
from ntp_planner.plan import Plan, RunnerUp
from topologies.cluster import Cluster
from topologies.cluster_catalogue import ClusterSpec

TIME_LABELS = {
    "compute": "forward + backward compute",
    "recompute": "activation recompute",
    "tp_comm": "TP collectives",
    "cp_comm": "CP collectives (exposed)",
    "ep_comm": "expert all-to-all",
    "pp_p2p": "pipeline sends (exposed)",
    "pp_bubble": "pipeline bubble",
    "dp_comm_exposed": "DP gradient sync (exposed)",
    "optimizer": "optimizer step",
    "overhead": "fixed overhead",
}


MEMORY_LABELS = {"low_precision_weights": "fp8/fp4 weight copies"}


def gb(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def models_table(models: list[ModelSpec]) -> Table:
    t = Table(title="Models", box=box.SIMPLE_HEAD)
    t.add_column("name", no_wrap=True)
    for col in ("params", "layers", "hidden", "ffn", "heads", "vocab", "MoE"):
        t.add_column(col, justify="right", no_wrap=True)
    for m in models:
        experts = f"{m.num_experts} top-{m.moe_top_k}" if m.is_moe else "-"
        t.add_row(
            m.name,
            f"{m.num_params / 1e9:.1f}B",
            str(m.num_layers),
            str(m.hidden_size),
            str(m.ffn_hidden_size),
            f"{m.num_heads}/{m.num_kv_heads}",
            str(m.vocab_size),
            experts,
        )
    return t


def clusters_table(specs: list[ClusterSpec]) -> Table:
    t = Table(title="Clusters (bandwidths per GPU, one way)", box=box.SIMPLE_HEAD)
    t.add_column("name", no_wrap=True)
    for col in ("GPU", "NVLink domain", "GPUs/node", "NVLink", "scale-out", "description"):
        t.add_column(col, justify="right" if col in ("NVLink domain", "GPUs/node", "NVLink", "scale-out") else "left")
    for c in specs:
        t.add_row(
            c.name,
            c.gpu,
            str(c.domain_size),
            str(c.gpus_per_node),
            f"{c.nvlink_bw_bytes_per_s / 1e9:.0f} GB/s",
            f"{c.scaleout_bw_bytes_per_s / 1e9:.0f} GB/s",
            c.description,
        )
    return t


def cost_tables(cost: StepCost) -> Group:
    """Headline numbers, time breakdown and memory breakdown."""
    head = Table(show_header=False, box=None)
    head.add_row("step time", f"{cost.step_time_s:.3f} s")
    head.add_row("MFU (full attention)", f"{cost.mfu:.1%}")
    head.add_row("MFU (causal attention)", f"{cost.mfu_causal:.1%}")
    head.add_row("tokens/s", f"{cost.tokens_per_s:,.0f}")
    head.add_row("memory per GPU", f"{gb(cost.memory_per_gpu_bytes)} of {gb(cost.hbm_bytes)}")
    time = Table(title="Where the time goes")
    time.add_column("part")
    time.add_column("seconds", justify="right")
    time.add_column("share", justify="right")
    for k, v in cost.time_breakdown_s.items():
        if v > 0:
            time.add_row(TIME_LABELS.get(k, k), f"{v:.3f}", f"{v / cost.step_time_s:.1%}")
    mem = Table(title=f"Memory per GPU, stage {_fullest(cost)}")
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    mem.add_column("share", justify="right")
    for k, v in cost.memory_breakdown_bytes.items():
        if v > 0 or k != "low_precision_weights":
            mem.add_row(MEMORY_LABELS.get(k, k.replace("_", " ")), gb(v), f"{v / cost.memory_per_gpu_bytes:.1%}")
    return Group(head, time, mem, *profile_notes(cost))


def profile_notes(cost: StepCost, most: int = 6) -> list[Text]:
    """Where a profile did not cover a term (the analytical term stood in), a line each."""
    if not cost.notes:
        return []
    lines = [Text(f"Not in the profile ({len(cost.notes)}):", style="yellow")]
    lines += [Text(f"  {n}") for n in cost.notes[:most]]
    lines += [Text(f"  ... and {len(cost.notes) - most} more (--json lists them)")] if len(cost.notes) > most else []
    return lines


def _fullest(cost: StepCost) -> int:
    return max(range(len(cost.stage_memory_bytes)), key=cost.stage_memory_bytes.__getitem__)


def degrees_table(plan: Plan, efficiency=None) -> Table | Text:
    """Per-layer degrees as ranges of blocks per stage, with the reason for each deviation
    (costed with ``efficiency``, e.g. a profile, when given)."""
    from ntp_planner.solver.per_layer import block_label, explain_degrees

    lay = plan.layout
    if not lay.is_per_layer:
        return Text(f"Every block (embedding, {plan.model.num_layers} layers, LM head) runs at tp={lay.tp}.")
    extra = () if efficiency is None else (efficiency,)
    majority, runs = explain_degrees(plan.model, plan.training, lay, plan.cluster.build(), *extra)
    t = Table(title=f"Per-layer TP degrees (stage width {lay.tp}, majority degree {majority})", box=box.SIMPLE_HEAD)
    for col in ("stage", "blocks", "degree", "why it differs"):
        t.add_column(col, justify="right" if col in ("stage", "degree") else "left")
    for r in runs:
        t.add_row(str(r.stage), block_label(r.first, r.last, plan.model.num_layers), str(r.degree), r.why or "")
    return t


def megatron_line(plan: Plan) -> Text:
    if plan.megatron is None:
        return Text("Megatron-LM can run this plan as it is (one TP degree for every layer).")
    m = plan.megatron
    return Text(
        f"Megatron-expressible projection: {m.layout.describe()} at {m.step_time_s:.3f} s per step; "
        f"the per-layer plan has {plan.megatron_gap:+.1%} throughput over it."
    )


def domain_use(c: Cluster) -> list[Text]:
    """How much of each NVLink domain the job uses, when not all of every one; else nothing.
    E.g. "NVLink domains: 1 x 72 + 1 x 56 of 72 GPUs used (TP groups up to 8)"."""
    full, last = divmod(c.num_gpus, c.used_per_domain)
    if c.used_per_domain == c.spec.domain_size and not last:
        return []
    used = " + ".join(f"{k} x {u}" for k, u in ((full, c.used_per_domain), (1, last)) if k and u)
    return [Text(f"NVLink domains: {used} of {c.spec.domain_size} GPUs used (TP groups up to {c.tp_domain_size})")]


def plan_view(plan: Plan) -> Group:
    c = plan.cluster
    title = Text(
        f"{plan.model.name} on {c.num_gpus} x {c.spec.gpu} ({c.spec.name}), "
        f"seq {plan.training.seq_len}, global batch {plan.training.global_batch}, {plan.training.dtype}",
        style="bold",
    )
    parts = [
        title,
        *domain_use(plan.cluster.build()),
        Text(f"layout: {plan.layout.describe()}", style="bold green"),
        cost_tables(plan.predicted),
    ]
    if plan.layout.is_per_layer:
        parts += [degrees_table(plan), megatron_line(plan)]
    if plan.runners_up:
        parts.append(runners_up_table(plan))
    if plan.goodput_ranking:
        parts.append(goodput_table(plan))
    return Group(*parts)


def runners_up_table(plan: Plan) -> Table:
    t = Table(title="Runners-up")
    for col in ("layout", "step time", "MFU", "memory", "why it lost"):
        t.add_column(col, justify="left" if col in ("layout", "why it lost") else "right")
    for r in plan.runners_up:
        t.add_row(
            r.layout.describe(),
            f"{r.step_time_s:.3f} s",
            f"{r.mfu:.1%}",
            gb(r.memory_per_gpu_bytes),
            why_lost(plan.predicted, r),
        )
    return t


def why_lost(best: StepCost, r: RunnerUp, parts: int = 2) -> str:
    """The runner-up's slowest-growing parts relative to the chosen layout."""
    delta = r.step_time_s - best.step_time_s
    diffs = sorted(
        ((r.time_breakdown_s[k] - best.time_breakdown_s.get(k, 0.0), k) for k in r.time_breakdown_s), reverse=True
    )
    worse = [f"{TIME_LABELS.get(k, k)} +{d:.3f} s" for d, k in diffs[:parts] if d > 1e-6]
    return f"{delta:+.3f} s ({delta / best.step_time_s:+.1%}): " + ", ".join(worse or ["ties on time"])


def goodput_table(plan: Plan) -> Table:
    t = Table(title=f"Ranked by throughput under failures (strategy {plan.goodput_strategy})")
    for col in ("layout", "tokens/s", "expected goodput", "effective tokens/s"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    for e in plan.goodput_ranking:
        t.add_row(
            e.layout.describe(),
            f"{e.tokens_per_s:,.0f}",
            f"{e.capacity_goodput:.1%}",
            f"{e.effective_tokens_per_s:,.0f}",
        )
    return t


def explain_view(plan: Plan, efficiency=None) -> Group:
    extra = [goodput_table(plan)] if plan.goodput_ranking else []
    return Group(
        *extra,
        Text(f"{plan.model.name}: {plan.layout.describe()} ({plan.source})", style="bold"),
        *domain_use(plan.cluster.build()),
        cost_tables(plan.predicted),
        degrees_table(plan, efficiency),
        megatron_line(plan),
        runners_up_table(plan) if plan.runners_up else Text("No runners-up stored (the layout was given by the user)."),
    )


def explain_json(plan: Plan) -> dict:
    cost = plan.predicted
    return {
        "layout": plan.layout.model_dump(mode="json"),
        "step_time_s": cost.step_time_s,
        "time_breakdown_s": cost.time_breakdown_s,
        "memory_per_gpu_bytes": cost.memory_per_gpu_bytes,
        "memory_breakdown_bytes": cost.memory_breakdown_bytes,
        "profile_notes": cost.notes,
        "per_layer_tp": plan.per_layer_tp,
        "objective": plan.objective,
        "goodput_ranking": [e.model_dump(mode="json") for e in plan.goodput_ranking],
        "megatron_layout": plan.megatron.layout.model_dump(mode="json") if plan.megatron else None,
        "megatron_gap": plan.megatron_gap,
        "runners_up": [
            {
                "layout": r.layout.model_dump(mode="json"),
                "step_time_s": r.step_time_s,
                "delta_s": r.step_time_s - cost.step_time_s,
                "why": why_lost(cost, r),
            }
            for r in plan.runners_up
        ],
    }


def replan_view(r) -> Group:
    """Summary, the replicas that are not healthy, the reshard traffic."""
    head = Table(show_header=False, box=None)
    head.add_row("policy", r.policy + (f" (then {r.fallback})" if r.fallback else ""))
    covered = r.in_domain_spares_used
    failed = (
        f"{r.failed_gpus}; {r.degraded_groups} TP groups degraded after in-domain spares"
        if covered
        else f"{r.failed_gpus} in {r.degraded_groups} TP groups"
    )
    head.add_row("failed GPUs", failed + (f"; {r.spares_used} spare domains used" if r.spares_used else ""))
    if covered:
        head.add_row("in-domain spares used", f"{covered} (idle GPUs of the failed GPUs' own NVLink domains)")
    if getattr(r, "spares_note", None):
        head.add_row("spare domains", r.spares_note)
    head.add_row(
        "throughput kept", f"{r.throughput_relative:.2%}" + ("  (PAUSED: batch below target)" if r.paused else "")
    )
    head.add_row("global batch", f"{r.global_batch_reached} of {r.global_batch_target} sequences ({r.batch})")
    head.add_row("idle healthy GPUs", str(len(r.idle_gpus)))
    healthy = sum(1 for x in r.replicas if x.status == "healthy")
    t = Table(title=f"Replicas that changed ({healthy} of {len(r.replicas)} healthy)", box=box.SIMPLE_HEAD)
    for col in ("replica", "status", "TP per stage", "local batch", "power", "GPUs used", "idle"):
        t.add_column(col, justify="left" if col in ("status", "TP per stage", "power") else "right")
    for x in r.replicas:
        if x.status == "healthy":
            continue
        t.add_row(
            str(x.replica),
            x.status,
            _compact(x.stage_tp),
            str(x.local_batch),
            _compact([round(p, 3) for p in x.power]),
            str(x.gpus_used),
            str(x.gpus_idle),
        )
    parts = [head, t, *_replica_reasons(r.replicas)]
    if r.reshard is not None:
        rs = r.reshard
        parts.append(
            Text(
                f"NTP gradient reshard: {gb(rs.bytes_before_per_gpu)} per GPU before and after the DP all-reduce, "
                f"{rs.time_s * 1e3:.1f} ms, {rs.overlap_s * 1e3:.1f} ms hidden behind the last backward pass, "
                f"{rs.exposed_s * 1e3:.1f} ms exposed."
            )
        )
    return Group(*parts)


def _replica_reasons(replicas) -> list[Text]:
    """One line per distinct reason of the replicas that changed: 'dropped (replicas 3, 17): memory: ...'."""
    groups: dict[tuple[str, str], list[int]] = {}
    for x in replicas:
        if x.status != "healthy" and getattr(x, "reason", None):
            groups.setdefault((x.status, x.reason), []).append(x.replica)
    lines = []
    for (status, why), reps in groups.items():
        shown = ", ".join(map(str, reps[:8])) + (f" and {len(reps) - 8} more" if len(reps) > 8 else "")
        lines.append(Text(f"{status} (replica{'s' if len(reps) > 1 else ''} {shown}): {why}"))
    return lines


def _compact(values) -> str:
    """'4x8' for [8, 8, 8, 8]; the list otherwise."""
    return f"{len(values)}x{values[0]}" if len(set(values)) == 1 else ",".join(map(str, values))


def sweep_table(rows) -> Table:
    t = Table(title="Throughput loss over random failures (mean, p5, p95)")
    for col in ("policy", "failed", "mean loss", "p5", "p95"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        t.add_row(r.policy, f"{r.fraction:.3%}", f"{r.mean_loss:.2%}", f"{r.p5_loss:.2%}", f"{r.p95_loss:.2%}")
    return t


def simulation_table(results, cfg, sources: dict[str, str] | None = None) -> Group:
    t = Table(title=escape(f"Goodput over {cfg.days:g} days, {cfg.trials} trials (mean [p5-p95])"))
    for col in (
        "strategy",
        "goodput",
        "capacity goodput",
        "throughput loss",
        "hours paused",
        "interruptions",
        "spares needed",
        "idle GPU-h",
    ):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for name, r in results.items():
        m, lo, hi = r.mean, r.p5, r.p95
        t.add_row(
            name,
            f"{m.goodput:.1%}",
            escape(f"{m.capacity_goodput:.1%} [{lo.capacity_goodput:.1%}-{hi.capacity_goodput:.1%}]"),
            f"{m.throughput_loss:.1%}",
            f"{m.hours_paused:.1f}",
            f"{m.interruptions:.0f}",
            escape(f"{m.spares_needed:.0f} [{lo.spares_needed:.0f}-{hi.spares_needed:.0f}]"),
            f"{m.idle_gpu_hours:,.0f}",
        )
    first = next(iter(results.values()))
    worst = ", ".join(f"{name} {r.spares_needed_worst:.0f}" for name, r in results.items())
    return Group(
        t,
        Text(_simulation_footer(cfg, first.checkpoint_interval_s, first.mean.time_over_threshold, sources)),
        Text(f"spares needed: fewest spare domains that keep a fixed batch without pausing; worst trial: {worst}"),
    )


def _simulation_footer(cfg, interval_s: float, over: float, sources: dict[str, str] | None) -> str:
    """Checkpoints, recovery costs (and where they came from), failures, start, time over threshold."""
    src = sources or {}

    def cost(name: str, label: str) -> str:
        where = src.get(name, "default")
        return f"{label} {getattr(cfg, name):g} s" + (f" ({where})" if where != "default" else "")

    return (
        f"checkpoint every {interval_s / 60:.1f} min ({'Daly' if cfg.checkpoint_interval_s is None else 'fixed'}), "
        f"write {cfg.checkpoint_write_s:g} s; {cost('detection_s', 'detection')}, {cost('restart_s', 'restart')}, "
        f"{cost('reconfigure_s', 'reconfigure')}; failures {cfg.failure_rate_per_gpu_hour:.3g} per GPU-hour, "
        f"{cfg.start} start, {cfg.spares} spare domains; {over:.1%} of the time more than "
        f"{cfg.down_threshold:.3g} of GPUs down"
    )


def pool_table(rows: list[dict], cfg, sources: dict[str, str] | None = None) -> Group:
    """The spares sweep: per-GPU throughput (spares counted as GPUs paid for), goodput and hours
    paused against the pool size, per strategy."""
    t = Table(title=escape(f"Spare domains over {cfg.days:g} days, {cfg.trials} trials, {cfg.batch} batch (mean)"))
    for col in ("spares", "strategy", "per-GPU throughput", "goodput", "capacity goodput", "hours paused"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        t.add_row(
            str(r["spares"]),
            r["strategy"],
            escape(f"{r['gpu_throughput']:.1%} [{r['gpu_throughput_p5']:.1%}-{r['gpu_throughput_p95']:.1%}]"),
            f"{r['goodput']:.1%}",
            f"{r['capacity_goodput']:.1%}",
            f"{r['hours_paused']:.1f}",
        )
    note = "per-GPU throughput: capacity goodput x job GPUs / (job GPUs + spare GPUs)"
    if any(r["strategy"] == "restart" for r in rows):
        note += "; restart restarts on replacement hardware and does not draw on the pool"
    src = sources or {}
    used = ", ".join(
        f"{k.removesuffix('_s')} {getattr(cfg, k):g} s ({src.get(k, 'default')})"
        for k in ("detection_s", "restart_s", "reconfigure_s")
    )
    return Group(t, Text(note), Text(f"{cfg.start} start; recovery costs: {used}"))


def validate_json(shrunk, result, tolerance: float, backend: str, cuts: list[dict] | None = None) -> dict:
    """What `ntp validate --json` prints. ``cuts``: the shard cuts against the planner's shares
    (``executor.cuts.compare_cuts``); a mismatch fails the run."""
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
