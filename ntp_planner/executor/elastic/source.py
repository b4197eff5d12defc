"""Where the next layout's state comes from after a re-plan: the survivors' memory, the last
complete checkpoint, or the initial weights."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """The next generation's start: its first step, the samples consumed before it, where its
    state comes from ("memory", "checkpoint" or "init"), the checkpoint's step, a note for the
    timeline and the move plan (``handover.plan``: rows, or shards under ZeRO and ep > 1; None unless
    from memory)."""

    start: int
    consumed: int
    source: str
    checkpoint_step: int | None = None
    note: str = ""
    moves: object = None


def state_source(policy: str, held, layout, committed: int, consumed: int, checkpoint_dir: str, records) -> Source:
    """From memory when every row of ``layout`` has a live up-to-date holder in ``held`` (the
    generation whose layout holds the committed state; None: no layout had its state in place,
    so from the initial weights); else (and always under ``restart``) from the last complete
    checkpoint, or the initial weights when there is none. The committed ``records`` after that
    start are marked lost (rolled back); returns them too.

    Example: TP rank 1 of both replicas of TP4 x DP2 dies in step 3 with checkpoints every 2
    steps: nobody holds those rows, the checkpoint of step 1 is the newest, so the next layout
    starts at step 2 and step 2's committed record is marked lost.
    """
    from ntp_planner.executor import checkpoint
    from ntp_planner.executor.elastic import handover

    if held is None:
        return Source(0, 0, "init", note="no layout had its state in place yet, so from the initial weights")
    note, moves = "", None
    if policy != "restart":
        moves = handover.plan(held.layout.spec, held.layout.procs, layout.spec, layout.procs)
        if not moves.missing:
            return Source(committed, consumed, "memory", moves=moves)
        names = sorted({m[0] for m in moves.missing})
        note = f"no live copy of rows of {len(names)} parameters ({names[0]}, ...): "
    ckpt = checkpoint.latest(checkpoint_dir) if checkpoint_dir else None
    if ckpt is None:
        src = Source(0, 0, "init", note=note + "no checkpoint yet, so from the initial weights", moves=moves)
    else:
        meta = checkpoint.info(checkpoint_dir, ckpt)
        src = Source(ckpt + 1, int(meta["consumed_samples"]), "checkpoint", ckpt,
                     note + f"from the checkpoint of step {ckpt}", moves)  # fmt: skip
    for r in records:
        if not r.get("lost") and r["step"] >= src.start:
            r["lost"] = True
    return src
