"""A plan and why it won: `ntp plan`, `ntp explain` and `ntp estimate` (its cost tables, degrees,
runners-up, goodput and the Megatron line). Nothing here prints; the CLI does."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from cost_models.step import StepCost
from ntp_planner.plan import Plan, RunnerUp
from ntp_planner.views.model import model_lines, params_json
from topologies.cluster import Cluster

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
    (costed with ``efficiency``, e.g. a profile, when given, else for the plan's runtime)."""
    from ntp_planner.solver.per_layer import block_label, explain_degrees

    lay = plan.layout
    if not lay.is_per_layer:
        return Text(f"Every block (embedding, {plan.model.num_layers} layers, LM head) runs at tp={lay.tp}.")
    eff = plan.default_efficiency if efficiency is None else efficiency
    majority, runs = explain_degrees(plan.model, plan.training, lay, plan.cluster.build(), eff)
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
        *model_lines(plan.model, plan.layout),
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
    if plan.search_notes:
        parts += [Text(f"Search notes ({len(plan.search_notes)}):", style="yellow")]
        parts += [Text(f"  {n}") for n in plan.search_notes]
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
        *model_lines(plan.model, plan.layout),
        *domain_use(plan.cluster.build()),
        cost_tables(plan.predicted),
        degrees_table(plan, efficiency),
        megatron_line(plan),
        runners_up_table(plan) if plan.runners_up else Text("No runners-up stored (the layout was given by the user)."),
    )


def explain_json(plan: Plan) -> dict:
    cost = plan.predicted
    return {
        **params_json(plan.model),
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
