"""Sentences about what the shrink changed and why, and the warning when a re-plan's run holds
no degraded replica. Pure text from the plan, the re-plan and the shrink's choices; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ntp_planner.replan_result import ReplanResult

MAX_STAGES = 4  # the shrink runs at most this many pipeline stages (``fit.fit``)
HOSTED_WHY = ": they hold whole EP groups, the re-hosted group's replicas first, then those of other kinds that fit"


def cut_runs_note(
    stage: int, plan_stages: tuple[int, ...], runs: list[int], kept: list[int], chunk: int | None = None
) -> str:
    """The note for a run stage (its virtual ``chunk`` when interleaved) whose runs of equal
    degree were cut to ``len(kept)`` layers.

    >>> note = cut_runs_note(0, (0, 1), [4, 2, 4, 1, 2, 8, 1], [4, 2, 4, 1, 2, 8])
    >>> note[:75], note[-24:]
    ('stage 0 (plan stages 0+1): kept 6 of 7 runs of equal TP degree, 4,2,4,1,2,8', 'every degree still runs)')
    >>> cut_runs_note(1, (2,), [2, 4, 2, 1], [2, 4])[-38:]
    'degree 1 no longer runs on this stage)'
    """
    left = runs[len(kept) :]
    lost = sorted(set(left) - set(kept))
    what = f"degree {', '.join(map(str, lost))} no longer runs on this stage" if lost else "every degree still runs"
    where = f"stage {stage}" + ("" if chunk is None else f" chunk {chunk}")
    return (
        f"{where} (plan stage{'s' if len(plan_stages) > 1 else ''} {'+'.join(map(str, plan_stages))}): "
        f"kept {len(kept)} of {len(runs)} runs of equal TP degree, {','.join(map(str, kept))}, cutting "
        f"{','.join(map(str, left))} (one layer per run would make a longer, slower run; {what})"
    )


def stages_why(run_pp: int, plan_pp: int, nproc: int | None) -> str:
    """Why the run has fewer stages than the plan.

    >>> stages_why(2, 8, 16), stages_why(4, 8, 64)
    (': more stages need more than 16 processes', ': at most 4 stages run')
    """
    if run_pp >= MAX_STAGES and plan_pp > MAX_STAGES:
        return f": at most {MAX_STAGES} stages run"
    return f": more stages need more than {nproc} processes" if nproc else ": to fit the processes"


def replicas_why(
    plan_dp: int, kept: int, replan: ReplanResult | None, nproc: int | None, wanted: int = 2, ep: int = 1, zero: int = 0
) -> str:
    """Why the run has the replicas it has: of a plan (no re-plan), the shrink wants ``wanted``
    (``shrink.wanted_replicas``: two, or the plan's ep) and runs ``kept`` at the run's ``ep``.

    >>> replicas_why(128, 2, None, 16), replicas_why(2, 1, None, 4)
    (': two run the data-parallel sync, more add nothing new', ': two need more than 4 processes')
    >>> replicas_why(8, 4, None, 16, wanted=4, ep=4)
    ': 4 hold an expert-parallel group of ep 4 (and run the data-parallel sync), more add nothing new'
    >>> replicas_why(8, 2, None, 6, wanted=4, ep=2)
    ': 4 (an expert-parallel group) need more than 6 processes; the 2 kept run ep 2'
    >>> replicas_why(8, 3, None, 16, wanted=3, zero=1)
    ': three make a ZeRO group that divides no tensor evenly (shard padding runs), more add nothing new'
    """
    if replan is not None:
        kinds = len(_kinds(replan))
        if kept < kinds:
            more = f"more need more than {nproc} processes"
            return f": {kept} of the re-plan's {kinds} kinds (stage widths, micro-batches); {more}"
        if kinds == 1:
            return (
                ": the re-plan's one kind (stage widths, micro-batches), twice for the data-parallel sync"
                if kept > 1
                else ""
            )
        return f": one of each of the re-plan's {kinds} kinds (stage widths, micro-batches)"
    wanted = min(wanted, plan_dp)
    ep_wants = ep > 1 and wanted > 2 and not (zero and wanted == 3)
    if kept < wanted:
        need = "two" if wanted == 2 else f"{wanted} (an expert-parallel group)" if ep_wants else "three (a ZeRO group)"
        groups = f"; the {kept} kept run ep {ep}" if ep > 1 else ""
        return f": {need} need more than {nproc} processes{groups}"
    if kept == 3 and zero and not ep_wants:
        more = ", more add nothing new" if plan_dp > kept else ""
        return f": three make a ZeRO group that divides no tensor evenly (shard padding runs){more}"
    if kept > 2:
        return f": {kept} hold an expert-parallel group of ep {ep} (and run the data-parallel sync)" + (
            ", more add nothing new" if plan_dp > kept else ""
        )
    return ": two run the data-parallel sync, more add nothing new" if plan_dp > 2 else ""


def micro_why(run_pp: int) -> str:
    return f" (at most {max(2 * run_pp, 2)} per replica keep the run short; each keeps its share of the batch)"


def _kinds(replan: ReplanResult) -> dict[tuple, list[int]]:
    """Replicas that run, by kind (stage widths, local batch), in replica order."""
    out: dict[tuple, list[int]] = {}
    for x in replan.replicas:
        if x.status != "dropped":
            out.setdefault((tuple(x.stage_tp), x.local_batch), []).append(x.replica)
    return out


def replan_pick_notes(replan: ReplanResult, picked: list[int]) -> list[str]:
    """What each run replica is in the re-plan, the kinds left out, and the dropped replicas."""
    by_replica = {x.replica: x for x in replan.replicas}
    run = [
        f"{r} {by_replica[r].status}" + (f" ({by_replica[r].reason})" if by_replica[r].reason else "") for r in picked
    ]
    notes = ["re-plan replicas run: " + "; ".join(run)]
    missing = [reps for reps in _kinds(replan).values() if not set(reps) & set(picked)]
    if missing:
        notes.append(
            "re-plan replicas not run (the processes hold no more): "
            + "; ".join(
                f"{reps[0]} {by_replica[reps[0]].status} at TP {by_replica[reps[0]].stage_tp}" for reps in missing
            )
        )
    dropped = [x for x in replan.replicas if x.status == "dropped"]
    if dropped:
        shown = ", ".join(str(x.replica) for x in dropped[:8]) + (" ..." if len(dropped) > 8 else "")
        why = dropped[0].reason or "no reason recorded"
        notes.append(f"re-plan replicas dropped, not run: {shown} (replica {dropped[0].replica}: {why})")
    return notes


def no_degraded_warning(replan: ReplanResult, picked: list[int], nproc: int) -> str | None:
    """Why a run of ``replan`` (plan replicas ``picked``) checks no NTP sync, or None when it
    runs a degraded replica beside one of another width."""
    by_replica = {x.replica: x for x in replan.replicas}
    run = [by_replica[r] for r in picked]
    degraded = [x for x in replan.replicas if x.status == "degraded"]
    dropped = [x for x in replan.replicas if x.status == "dropped"]
    if any(x.status == "degraded" for x in run):
        if len({tuple(x.stage_tp) for x in run}) > 1:
            return None
        return (
            f"every replica the run holds has stage widths {run[0].stage_tp}, so no NTP sync between degrees runs "
            f"(plan replicas {', '.join(str(x.replica) for x in run)})"
        )
    if degraded:
        return (
            f"the shrink to {nproc} processes kept only healthy replicas ({', '.join(str(x.replica) for x in run)}), "
            f"none of the re-plan's {len(degraded)} degraded ones (first: {degraded[0].replica}, TP "
            f"{degraded[0].stage_tp}); give more processes (--nproc) to run one and its NTP sync"
        )
    tail = ", so the run is the healthy plan's and checks no NTP sync"
    if dropped:
        which = "the one replica" if len(dropped) == 1 else f"all {len(dropped)} replicas"
        verb = "is" if len(dropped) == 1 else "are"
        why = dropped[0].reason or "no reason recorded"
        return (
            f"the re-plan degrades no replica: {which} that lost GPUs {verb} dropped "
            f"(replica {dropped[0].replica}: {why}){tail}"
        )
    if not replan.failed_gpus:
        return f"the re-plan degrades no replica: it has no failed GPU{tail}"
    covered = [f"{replan.in_domain_spares_used} by in-domain spares"] if replan.in_domain_spares_used else []
    covered += [f"the rest by {replan.spares_used} spare domains"] if replan.spares_used else []
    return (
        f"the re-plan degrades no replica: its {replan.failed_gpus} failed GPUs are covered"
        + (f" ({', '.join(covered)})" if covered else "")
        + tail
    )


def _moe_notes(model, lay, cfg, picks, cp: int, ep: int) -> tuple[list[str], list[str]]:
    """(what the shrink did to the experts, what of them is not executed)."""
    if not model.num_experts:
        return [], []
    kept = (
        f"experts {model.num_experts} -> {cfg.experts} (top-{cfg.top_k}"
        + (" kept" if cfg.top_k == model.moe_top_k else f", the plan's top-{model.moe_top_k} cut to the experts")
        + ", dropless"
        + (
            ", two per EP rank so each rank's tokens are sorted among its experts"
            if cfg.experts > model.num_experts
            else ""
        )
        + "), "
        f"expert width {model.moe_ffn_hidden_size} -> {cfg.expert_ffn}"
        + (f", shared expert {model.moe_shared_ffn_hidden_size} -> {cfg.shared_ffn}" if cfg.shared_ffn else "")
        + f", MoE layers {', '.join(map(str, cfg.moe_layers)) or 'none'} of the run's {cfg.layers}"
        + (f", ep {lay.ep} kept" if ep == lay.ep > 1 else f", ep {lay.ep} -> {ep}" if lay.ep > 1 else "")
    )
    skipped = []
    if ep < lay.ep:
        if len({tuple(p[1]) for p in picks}) > 1:
            why = "replicas of different TP widths (NTP) do not hold the same expert slices"
        else:
            why = f"an ep of k needs k pipelines (replicas x cp), the run has {len(picks) * cp}; more processes keep it"
        skipped.append(f"ep {lay.ep} (run at ep {ep}: {why})")
    return [kept], skipped


@dataclass(frozen=True)
class RunShape:
    """What the shrink chose, for its notes."""

    pp: int  # run stages
    cp: int
    seq_len: int  # tokens per sequence
    groups: list  # plan stages merged into each run stage
    mb: int  # sequences per micro-batch
    run_micro: list  # micro-batches of each run replica
    vpp: int
    ep: int
    zero: int
    hosted: bool = False  # the run hosts the re-plan's re-hosted experts (``hosted``)


def shrink_notes(plan, cfg, run: RunShape, picks, replan, nproc: int | None, wanted: int) -> list[str]:
    """Sentences on what the shrink kept, changed and does not execute, and why. ``wanted``: the
    replicas the healthy plan's run would keep (``run.wanted_replicas``)."""
    lay, model = plan.layout, plan.model
    pp, cp, seq_len, groups, mb = run.pp, run.cp, run.seq_len, run.groups, run.mb
    run_micro, vpp, ep, zero = run.run_micro, run.vpp, run.ep, run.zero
    notes = [
        f"model {model.name}: {model.num_layers} layers -> {cfg.layers} (one per run of equal TP degree per "
        f"{'chunk' if vpp > 1 else 'stage'}), "
        f"hidden {model.hidden_size} -> {cfg.hidden} ({cfg.heads} heads, {cfg.kv_heads} KV heads kept), "
        f"FFN {model.ffn_hidden_size} -> {cfg.ffn}, vocabulary {model.vocab_size} -> {cfg.vocab} "
        f"(same remainder modulo every degree), sequence {plan.training.seq_len} -> {seq_len} tokens"
        " (enough for every cp chunk and sequence-parallel piece; no TP cut depends on the length)",
        f"{model.family} blocks kept: {cfg.norm} norm, {cfg.mlp} MLP, {'' if cfg.bias else 'no '}linear biases, "
        f"{cfg.positions} positions" + (f"; {lay.recompute} recompute kept" if lay.recompute != "none" else ""),
        f"pipeline {lay.pp} stages -> {pp}"
        + ("" if pp == lay.pp else " (" + ", ".join("+".join(map(str, g)) for g in groups) + " merged)")
        + ("" if pp == lay.pp else stages_why(pp, lay.pp, nproc))
        + (f", vpp {vpp} kept: interleaved 1F1B over {pp * vpp} chunks" if vpp > 1 else ""),
        f"replicas {lay.dp} -> {len(picks)} (plan replicas {', '.join(str(p[0]) for p in picks)})"
        + (HOSTED_WHY if run.hosted else replicas_why(lay.dp, len(picks), replan, nproc, wanted, ep, zero or 0)),
        f"micro-batch {lay.micro_batch} -> {mb} sequences (every copy of a lower-degree block gets one), "
        f"micro-batches per replica {lay.num_micro_batches} -> {', '.join(map(str, run_micro))}"
        + ("" if run_micro == [lay.num_micro_batches] * len(run_micro) else micro_why(pp))
        + (f" (multiples of pp {pp}: the interleaved schedule needs them)" if vpp > 1 else ""),
    ]
    if lay.cp > 1:
        notes.append(
            f"context parallelism cp {lay.cp}"
            + (" kept" if cp == lay.cp else f" -> {cp} (whole sequences; more processes keep it)")
        )
    moe_kept, moe_skipped = _moe_notes(model, lay, cfg, picks, cp, ep)
    notes += moe_kept
    skipped = list(moe_skipped)
    if lay.vpp > vpp:
        skipped += [f"vpp {lay.vpp} (only one pipeline stage fits and interleaving needs two; plain 1F1B)"]
    if lay.sequence_parallel and lay.is_per_layer:
        skipped += [
            "sequence parallelism on stages with lower-degree copies (all-reduce there: a copy holds whole "
            "sequences of its share of the micro-batch, so the executor splits sequences only where every block "
            "runs at the stage width)"
        ]
    if zero != lay.zero and run.hosted:
        skipped += [f"ZeRO-{lay.zero} (run as ZeRO-0: the re-hosted experts are held whole on their holders)"]
    elif zero != lay.zero:
        skipped += [
            f"ZeRO-{lay.zero}'s per-micro-batch parameter gathers between replicas of different TP degrees or "
            f"micro-batches (run as ZeRO-{zero}: the same sharded optimizer state and gradients)"
        ]
    skipped += ["tied input and output embeddings (run as two matrices)"] if model.tie_embeddings else []
    skipped += [f"dropout {model.dropout:g} (off: the check is deterministic)"] if model.dropout else []
    if skipped:
        notes.append("not executed: " + "; ".join(skipped))
    if replan is not None:
        notes.append(f"re-plan ({replan.policy}): replicas run at stage widths " + "; ".join(
            f"{p[0]}: {'/'.join(map(str, p[1]))}" for p in picks
        ))  # fmt: skip
        notes += replan_pick_notes(replan, [p[0] for p in picks])
    return notes


def hosting_notes(replan: ReplanResult, stages: list[int], rank_of: dict[int, int], run_experts: int,
                  plan_experts: int, ep: int) -> list[str]:  # fmt: skip
    """What the run hosts of the re-plan's re-hosted experts: per EP group it holds (of plan
    stage ``stages[j]`` for run stage j), the ranks it lost and which survivor took which of
    their experts (plan expert ids; ``rank_of``: plan rank -> process)."""
    out, q = [], plan_experts // ep
    for j, s in enumerate(stages):
        for x in replan.experts:
            if x.stage != s or x.mode != "rehosted" or not set(x.ep_group) & set(rank_of):
                continue
            group = sorted(x.ep_group + x.lost)
            took: dict[int, list[int]] = {}
            for e, (owner,) in enumerate(x.owners):
                if group[e // q] in x.lost:
                    took.setdefault(owner, []).append(e)
            where = "; ".join(
                f"rank {r} (process {rank_of[r]}) experts {', '.join(map(str, es))}" for r, es in sorted(took.items())
            )
            out.append(
                f"re-plan's re-hosted experts run (ep {ep}, whole experts): stage {j} (plan stage {s}) EP group "
                f"{', '.join(map(str, group))} lost rank{'s' if len(x.lost) > 1 else ''} "
                f"{', '.join(map(str, x.lost))}, its experts now on {where} (busiest survivor {x.load_factor:.3g}x)"
            )
    if out and run_experts != plan_experts:
        out.append(f"run expert k stands for plan expert k * {plan_experts} // {run_experts} (``hosted.plan_expert``)")
    return out
