"""Which runs the executor can run exactly: ``check`` refuses a ``RunSpec`` (ValueError, one
sentence) whose model, counts, experts, virtual chunks, context parallelism or ZeRO level it
cannot shard; ``RunSpec`` calls it on construction, so this module reads the spec through a
protocol of the fields it checks and imports nothing of ``executor.spec``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ntp_planner.executor.parallel.ownership import contiguous


class RunSpec(Protocol):
    """What the checks read of a run (``executor.spec.RunSpec``, which calls ``check`` on
    construction): a protocol, so that this module does not import the one that imports it."""

    cfg: Any  # TinyConfig
    replicas: Sequence[Any]  # ReplicaSpec
    micro_batch: int
    seq_len: int
    steps: int
    dtype: str
    recompute: str
    sequence_parallel: bool
    zero: int
    reshard_after_forward: bool
    vpp: int
    cp: int
    ep: int
    etp: int | None
    hosting: Sequence[Any]  # StageExperts

    @property
    def pp(self) -> int: ...


def check(spec: RunSpec) -> None:
    """Raise ValueError, showing the arithmetic, if ``spec`` cannot run."""
    cfg = spec.cfg
    _check_config(cfg)
    _check_counts(spec)
    ranks = sorted(r for rep in spec.replicas for st in rep.stages for r in st.ranks)
    if ranks != list(range(len(ranks))):
        raise ValueError(f"process ranks must be 0..{len(ranks) - 1}, each once; got {ranks}")
    layout = [[[tuple((b.kind, b.layer) for b in c) for c in st.chunks] for st in rep.stages] for rep in spec.replicas]
    if any(x != layout[0] for x in layout):
        raise ValueError("every replica must hold the same blocks on the same stages")
    _check_cp(spec)
    _check_chunks(spec)
    _check_moe(spec)
    _check_zero(spec)
    if spec.recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full'; got {spec.recompute!r}")
    if cfg.positions == "learned" and spec.seq_len > cfg.max_positions:
        raise ValueError(
            f"the sequence of {spec.seq_len} tokens is longer than the {cfg.max_positions} learned positions"
        )
    names = [(b.kind, b.layer) for chunk in spec.replicas[0].model_chunks for b in chunk]
    expected = [("embed", -1)] + [("layer", i) for i in range(cfg.layers)] + [("head", -1)]
    if names != expected:
        where = "stages" if spec.vpp == 1 else "chunks (chunk c on stage c % pp as virtual chunk c // pp)"
        raise ValueError(f"{where} must hold embedding, layers 0..{cfg.layers - 1} and LM head in order; got {names}")
    for i, rep in enumerate(spec.replicas):
        if rep.micro_batches < 1:
            raise ValueError(f"replica {i} has {rep.micro_batches} micro-batches; it needs at least 1")
        if spec.vpp > 1 and rep.micro_batches % spec.pp:
            raise ValueError(
                f"replica {i} runs {rep.micro_batches} micro-batches but the interleaved schedule (vpp {spec.vpp}) "
                f"needs a multiple of pp: {rep.micro_batches} % {spec.pp} = {rep.micro_batches % spec.pp}"
            )
        for s, st in enumerate(rep.stages):
            for b in st.blocks:
                if st.width % b.degree:
                    raise ValueError(
                        f"replica {i} stage {s}: {b.name} at degree {b.degree} does not divide the stage width "
                        f"{st.width}"
                    )
                copies = st.width // b.degree
                if spec.micro_batch % copies:
                    raise ValueError(
                        f"replica {i} stage {s}: micro_batch({spec.micro_batch}) is not divisible by the "
                        f"{copies} copies of {b.name} (width {st.width} / degree {b.degree})"
                    )
                if b.degree > min(cfg.heads, cfg.ffn, cfg.vocab):
                    raise ValueError(
                        f"{b.name} degree {b.degree} exceeds the model's heads({cfg.heads}), ffn({cfg.ffn}) or "
                        f"vocab({cfg.vocab}): every TP rank needs at least one of each"
                    )
                widths = (cfg.expert_ffn, *([cfg.shared_ffn] if cfg.shared_ffn else ()))
                if b.kind == "layer" and cfg.is_moe(b.layer) and b.degree > min(widths):
                    raise ValueError(f"{b.name} degree {b.degree} exceeds the expert widths {widths}")


_CHOICES = {"norm": ("rms", "layer"), "mlp": ("swiglu", "gelu", "relu2"), "positions": ("rope", "learned")}


def _check_config(cfg: Any) -> None:
    """The decoder's shape: whole heads over the width, whole query groups per KV head, and
    block styles the model knows (an unknown norm or positions would run as RMSNorm / rotary)."""
    for name, choices in _CHOICES.items():
        if getattr(cfg, name) not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; got {getattr(cfg, name)!r}")
    if min(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.vocab, cfg.ffn) < 1 or cfg.layers < 0:
        raise ValueError(
            f"hidden({cfg.hidden}), heads({cfg.heads}), kv_heads({cfg.kv_heads}), vocab({cfg.vocab}) and "
            f"ffn({cfg.ffn}) must be at least 1 and layers({cfg.layers}) at least 0"
        )
    if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
        raise ValueError(
            f"hidden({cfg.hidden}) % heads({cfg.heads}) = {cfg.hidden % cfg.heads} and heads({cfg.heads}) % "
            f"kv_heads({cfg.kv_heads}) = {cfg.heads % cfg.kv_heads} must both be 0"
        )
    if cfg.positions == "rope" and cfg.head_dim % 2:
        raise ValueError(f"rotary positions rotate pairs of channels; head_dim {cfg.head_dim} is odd")


def _check_counts(spec: RunSpec) -> None:
    """At least one pipeline of non-empty stages, positive degrees, sequences and steps."""
    if not spec.replicas or any(not rep.stages for rep in spec.replicas):
        raise ValueError(f"a run needs at least one replica of at least one stage; got {len(spec.replicas)} replicas")
    for i, rep in enumerate(spec.replicas):
        for s, st in enumerate(rep.stages):
            bad = [b.name for b in st.blocks if b.degree < 1]
            if not st.ranks or bad:
                raise ValueError(
                    f"replica {i} stage {s} has {st.width} ranks and blocks at degree < 1: {bad}; it needs a rank "
                    "and every degree at least 1"
                )
    if spec.micro_batch < 1 or spec.steps < 1:
        raise ValueError(f"micro_batch({spec.micro_batch}) and steps({spec.steps}) must be at least 1")


def _check_moe(spec: RunSpec) -> None:
    cfg = spec.cfg
    if cfg.moe_layers and (cfg.mlp != "swiglu" or cfg.bias):
        raise ValueError(
            "MoE layers run SwiGLU experts without biases; this config has a "
            f"{cfg.mlp} MLP" + (" with biases" if cfg.bias else "")
        )
    if cfg.moe_layers and not (0 < cfg.top_k <= cfg.experts and cfg.expert_ffn >= 1):
        raise ValueError(
            f"MoE layers need 1 <= top_k({cfg.top_k}) <= experts({cfg.experts}) and expert_ffn({cfg.expert_ffn}) >= 1"
        )
    if any(not 0 <= i < cfg.layers for i in cfg.moe_layers):
        raise ValueError(f"moe_layers {cfg.moe_layers} must be layer indices 0..{cfg.layers - 1}")
    if spec.hosting:
        return check_hosting(spec)
    if spec.etp is not None:
        return _check_folding(spec)
    if spec.ep == 1:
        return
    pipelines = len(spec.replicas)
    if not cfg.moe_layers or cfg.experts % spec.ep or pipelines % spec.ep:
        raise ValueError(
            f"ep({spec.ep}) needs MoE layers, experts({cfg.experts}) % ep = 0 and pipelines({pipelines}) "
            f"= replicas x cp % ep = 0"
        )
    _same_shapes(spec, "needs the experts' hosting (``hosting``): the all-to-all peers would hold different TP slices")


def _same_shapes(spec: RunSpec, why: str) -> None:
    shape = lambda r: ([(st.width, [b.degree for b in st.blocks]) for st in r.stages], r.micro_batches)  # noqa: E731
    if any(shape(r) != shape(spec.replicas[0]) for r in spec.replicas):
        raise ValueError(f"expert parallelism beside replicas of different TP widths or batches (NTP) {why}")


def _check_folding(spec: RunSpec) -> None:
    """Parallel folding: the experts' grid etp x ep x edp over each stage's ranks; every
    expert-TP group inside one attention TP copy (etp divides each MoE layer's degree)."""
    cfg, ep, etp = spec.cfg, spec.ep, spec.etp
    if not cfg.moe_layers or etp < 1 or cfg.experts % ep:
        raise ValueError(f"etp({etp}) needs MoE layers, etp >= 1 and experts({cfg.experts}) % ep({ep}) = 0")
    _same_shapes(spec, "needs explicit expert hosting (``hosting``) under parallel folding")
    for s, st in enumerate(spec.replicas[0].stages):
        width = st.width * len(spec.replicas)
        if width % (etp * ep):
            raise ValueError(
                f"stage {s}: etp({etp}) * ep({ep}) = {etp * ep} does not divide its {width} ranks "
                f"({len(spec.replicas)} pipelines x width {st.width})"
            )
        for b in st.blocks:
            if b.kind == "layer" and cfg.is_moe(b.layer) and b.degree % etp:
                raise ValueError(f"etp({etp}) must divide the TP degree of {b.name} ({b.degree})")
    if spec.zero:
        raise ValueError(f"ZeRO {spec.zero} beside parallel folding is not supported; use zero 0")


def check_hosting(spec: RunSpec) -> None:
    """Explicit expert hosting: per stage, EP groups that split its ranks, each holding every
    expert whole once; the ranks of a group in lockstep (equal micro-batches) so the
    all-to-alls pair up."""
    cfg = spec.cfg
    if len(spec.hosting) != spec.pp or spec.etp not in (None, 1) or spec.zero or not cfg.moe_layers:
        raise ValueError(
            f"expert hosting needs MoE layers, one entry per stage ({len(spec.hosting)} for pp {spec.pp}), "
            f"whole experts (etp {spec.etp}) and zero 0 (zero {spec.zero})"
        )
    micro = {r: rep.micro_batches for rep in spec.replicas for st in rep.stages for r in st.ranks}
    for s, host in enumerate(spec.hosting):
        ranks = sorted(r for rep in spec.replicas for r in rep.stages[s].ranks)
        if sorted(r for g in host.groups for r in g) != ranks:
            raise ValueError(f"stage {s}: the EP groups {host.groups} must split its ranks {ranks}, each once")
        for g in host.groups:
            if len({micro[r] for r in g}) > 1:
                raise ValueError(
                    f"stage {s}: EP group {g} spans pipelines of {sorted({micro[r] for r in g})} micro-batches; its "
                    "ranks meet in every all-to-all, so they need equal micro-batches"
                )
        if len(host.owners) != cfg.experts:
            raise ValueError(f"stage {s}: {len(host.owners)} expert owner sets for {cfg.experts} experts")
        for e, owners in enumerate(host.owners):
            per_group = [sum(r in g for r in owners) for g in host.groups]
            if per_group != [1] * len(host.groups) or len(owners) != len(host.groups):
                raise ValueError(
                    f"stage {s}: expert {e} is held by {owners}: one rank of each EP group needs it, "
                    f"got {per_group} per group"
                )


def _check_chunks(spec: RunSpec) -> None:
    """Every stage holds ``vpp`` chunks, each at least one block; interleaving needs two stages.

    Megatron-Core's interleaved schedule runs micro-batches in groups of
    ``microbatch_group_size_per_vp_stage`` (default pp) per chunk and requires that size to lie
    in [pp, m] and the last group (m mod size) to be 0 or at least pp (``schedules.py``,
    ``forward_backward_pipelining_with_interleaving``): with the default, m must be a multiple
    of pp, which ``check`` asks of every replica.
    """
    if spec.vpp < 1 or (spec.vpp > 1 and spec.pp < 2):
        raise ValueError(f"interleaving (vpp {spec.vpp}) needs vpp >= 1 and, above 1, at least 2 stages")
    for s, st in enumerate(spec.replicas[0].stages):
        sizes = st.chunk_sizes or (len(st.blocks),)
        if len(sizes) != spec.vpp or sum(sizes) != len(st.blocks) or min(sizes) < 1:
            raise ValueError(
                f"stage {s} holds {len(st.blocks)} blocks in chunks of {list(sizes)}; vpp {spec.vpp} needs "
                f"{spec.vpp} chunks of at least one block each, adding up to its blocks"
            )


def _check_cp(spec: RunSpec) -> None:
    if spec.cp < 1 or len(spec.replicas) % spec.cp or spec.seq_len < spec.cp:
        raise ValueError(
            f"cp {spec.cp} needs a whole number of slices per replica ({len(spec.replicas)} pipelines) and at "
            f"least one token each (sequence {spec.seq_len})"
        )
    for i, rep in enumerate(spec.replicas):
        first = spec.replicas[i - rep.cp_rank]
        shape = lambda r: ([[b.degree for b in st.blocks] for st in r.stages], r.micro_batches)  # noqa: E731
        if rep.cp_rank != i % spec.cp or shape(rep) != shape(first):
            raise ValueError(f"pipeline {i} is not cp slice {i % spec.cp} of its replica with the same stages")
    if spec.sequence_parallel:
        shortest = min(b - a for a, b in contiguous(spec.seq_len, spec.cp))
        widest = max(st.width for rep in spec.replicas for st in rep.stages)
        if shortest < widest:
            raise ValueError(
                f"sequence parallelism gives each of {widest} ranks a piece of a {shortest}-token chunk; "
                "lengthen the sequence"
            )


DTYPES = ("float32", "float64", "bfloat16")  # bfloat16: fp32 master weights and gradients (``zero``)


def _check_zero(spec: RunSpec) -> None:
    if spec.dtype not in DTYPES:
        raise ValueError(f"dtype {spec.dtype!r} is not one of {', '.join(DTYPES)}")
    if spec.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero {spec.zero} is not a ZeRO level (0, 1, 2 or 3)")
    if not spec.reshard_after_forward and spec.zero < 3:
        raise ValueError(f"keeping gathered parameters after forward needs zero 3 (this run is zero {spec.zero})")
    if spec.zero < 3:
        return
    degrees = {tuple(b.degree for st in rep.stages for b in st.blocks) for rep in spec.replicas}
    micro = sorted({rep.micro_batches for rep in spec.replicas})
    if len(degrees) > 1:
        raise ValueError("ZeRO-3 needs every replica to run each block at one TP degree (no NTP); use zero 2 or less")
    if len(micro) > 1:
        raise ValueError(
            f"ZeRO-3 gathers parameters for every micro-batch, so replicas need equal micro-batches; got {micro}"
        )
