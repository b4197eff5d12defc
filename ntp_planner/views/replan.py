"""A re-plan after failures: `ntp replan`'s layout per replica and why. Nothing here prints; the
CLI does."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ntp_planner.views.model import params_text
from ntp_planner.views.plan import gb


def replan_view(r, model=None) -> Group:
    """The model's size, the summary, the replicas that are not healthy, the EP groups that lost
    members (MoE), the reshard traffic."""
    head = Table(show_header=False, box=None)
    if model is not None:
        head.add_row("model", params_text(model))
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
    parts = [head, t, *_replica_reasons(r.replicas), *_expert_lines(getattr(r, "experts", []))]
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


def _expert_lines(experts) -> list[Text]:
    """One line per EP group that lost members: re-hosted (its load factor, the state moved) or dropped."""
    lines = []
    for x in experts[:8]:
        what = f"re-hosted, {gb(x.moved_bytes)} of expert state moved" if x.mode == "rehosted" else "dropped"
        lines.append(
            Text(f"EP group of stage {x.stage} (ranks {_ranges(sorted(x.ep_group + x.lost))}): {what}; {x.reason}")
        )
    if len(experts) > 8:
        lines.append(
            Text(f"and {len(experts) - 8} more EP groups ({sum(x.mode == 'dropped' for x in experts)} dropped)")
        )
    return lines


def _ranges(ranks: list[int]) -> str:
    """Ascending ranks as runs: '0-7' for 0..7, '0,2,4,6' for a stride.

    >>> _ranges([128, 129, 130, 131]), _ranges([0, 2, 4]), _ranges([5])
    ('128-131', '0,2,4', '5')
    """
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)) for run in runs)


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
