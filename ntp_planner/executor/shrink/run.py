"""Shrink a Plan (optionally re-planned after failures) to a run this host can afford, keeping
what makes its sharding what it is: the stage width, every block's TP degree (one layer per run
of equal degrees), the degraded replicas' widths and their share of the batch, the number of
query and KV heads, the FFN width and vocabulary modulo every degree in use (so uneven
splits cut at the same places), the block style (norm, MLP, biases, positions: ``block_style``)
and the recompute granularity. MoE plans keep which layers are MoE (a run of equal degrees is
split where the layer kind changes), top-k, a shared expert, expert widths modulo the degrees,
and ep as far as the run's pipelines allow (``_experts``); a re-plan that re-hosts experts keeps
the plan's ep and whole EP groups, hosting the lost members' experts where the re-plan says
(``hosted``). No torch here: ``ntp validate`` reports the shrink before it starts any process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_models.model import ModelSpec
from ntp_planner.executor.shrink.fit import fit, fit_units, split_stages
from ntp_planner.executor.shrink.hosted import hosted_units, run_hosting, run_stages
from ntp_planner.executor.shrink.notes import RunShape, cut_runs_note, hosting_notes, shrink_notes
from ntp_planner.executor.spec import RunSpec, TinyConfig, make_spec
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult
from topologies.errors import InputError

MAX_LAYERS_PER_STAGE = 6
SEQ_LEN = 8
MAX_EXPERTS = 16  # more experts per layer are cut to this many (keeping whole experts per EP rank)


@dataclass(frozen=True)
class Shrunk:
    spec: RunSpec
    plan_ranks: tuple[tuple[int, int | None], ...]  # per process: (plan rank it stands for, GPU)
    replicas: tuple[int, ...]  # plan replica of each run replica
    stage_groups: tuple[tuple[int, ...], ...]  # plan stages merged into each run stage


def _same_remainder(value: int, modulus: int, at_least: int) -> int:
    """Smallest number >= at_least congruent to ``value`` modulo ``modulus``.

    >>> _same_remainder(28672, 7 * 8, 64)  # 28672 = 512 * 56: a multiple of 56 stays one
    112
    """
    r = value % modulus
    return r + modulus * max(1 if r == 0 else 0, math.ceil((at_least - r) / modulus))


def block_style(model: ModelSpec) -> dict:
    """The TinyConfig fields that make the executor's blocks the model's: its norm, its MLP
    (SwiGLU when gated, else Nemotron's squared ReLU or GPT's GELU, by ``mlp_activation``), its
    linear biases and its positions.

    >>> from cost_models.catalogue import MODELS
    >>> block_style(MODELS["gpt3-5b"])
    {'norm': 'layer', 'mlp': 'gelu', 'bias': True, 'positions': 'learned'}
    >>> block_style(MODELS["nemotron4-15b"])
    {'norm': 'layer', 'mlp': 'relu2', 'bias': False, 'positions': 'rope'}
    >>> block_style(MODELS["nemotron4-15b"].model_copy(update={"family": "gpt"}))["mlp"]  # as from config.json
    'relu2'
    """
    mlp = "swiglu" if model.gated_mlp else "relu2" if model.mlp_activation == "squared_relu" else "gelu"
    norm = "layer" if model.norm == "layernorm" else "rms"
    return {"norm": norm, "mlp": mlp, "bias": model.bias, "positions": model.position}


def wanted_replicas(lay, failures: int = 0) -> int:
    """Replicas the shrink of a plan (no re-plan) starts from: two for the data-parallel sync,
    three under ZeRO (a group of 3 divides none of the run's tensor sizes, which are even, so the
    shards' padding runs: ``optimizer.shard_bounds``), or as many as an expert-parallel group
    spans (ep pipelines, cp of them per replica: ``_ep``; under parallel folding ep x etp ranks,
    tp per pipeline), two groups when a live run will lose
    processes (``failures``: every expert then has a peer holding it, its expert-data-parallel
    replica, from which its state is rebuilt); never more than the plan's dp."""
    group = -(-lay.ep * lay.expert_tp // (lay.tp * lay.cp))  # pipelines an EP group spans (folded: fewer)
    return min(max(3 if lay.zero else 2, group * (2 if failures and lay.ep > 1 else 1)), lay.dp)


def scaled_micro_batches(ratio: float, m: int, unit: int) -> int:
    """Micro-batches of a replica that processes ``ratio`` of the plan's local batch, when a
    healthy replica of the run processes ``m`` (a multiple of ``unit``: pp under the interleaved
    schedule, else 1): ``ratio * m`` rounded to whole units, at least one unit, and for a
    degraded replica (ratio < 1) one unit fewer than ``m`` when rounding would reach it, so that
    the run keeps the plan's fact that it processes fewer sequences (unless ``m`` is one unit).
    ``shrink`` and ``relayout`` both scale a degraded replica's micro-batches with it.

    >>> scaled_micro_batches(6 / 8, 4, 1), scaled_micro_batches(7 / 8, 4, 1), scaled_micro_batches(1 / 8, 4, 2)
    (3, 3, 2)
    """
    k = max(unit, unit * round(ratio * m / unit))
    return max(unit, m - unit) if ratio < 1 and k >= m else k


def _runs(degrees: list[int]) -> list[int]:
    """One entry per run of equal degrees."""
    return [d for i, d in enumerate(degrees) if i == 0 or degrees[i - 1] != d]


def shrink(
    plan: Plan,
    nproc: int,
    replan: ReplanResult | None = None,
    steps: int = 3,
    seed: int = 0,
    seq_len: int = SEQ_LEN,
    failures: int = 0,
) -> Shrunk:
    """The run that stands for ``plan`` on ``nproc`` processes, with notes on what changed.
    ``seq_len``: tokens per sequence of the run (longer ones make a timing run compute-bound).
    ``failures``: processes a live run will lose; the widths its re-plans can reach (a stage of
    width w that loses k runs every block at w - k, ``relayout``) join the degrees whose
    remainders the model keeps, so those layouts cut as the planner deals too."""
    lay, model = plan.layout, plan.model
    w = lay.tp
    if replan is not None:
        replan.check_against(plan)
    units = hosted_units(plan, replan)  # whole EP groups, when the run hosts the re-plan's re-hosted experts
    if units is None:
        pp, picks, cp = fit(_picks(plan, replan, failures), lay.pp, w, nproc, replan is not None, lay.cp)
    else:
        (pp, picks), cp = fit_units(units, lay.pp, nproc, lay.cp), lay.cp
    groups = [tuple(g) for g in split_stages(lay.pp, pp)]
    vpp = lay.vpp if pp > 1 else 1  # interleaving needs two stages
    ep, picks = _ep(lay, picks, cp, replan) if units is None else (lay.ep, picks)
    chunk_degrees, cut, moe_flags = _chunk_degrees(plan, groups, vpp)
    moe_layers = tuple(i for i, is_moe in enumerate(moe_flags) if is_moe)
    ep = ep if moe_layers else 1  # the layers kept may all be dense
    hosted = units is not None and bool(moe_layers)
    etp, ep, fold_note = _folding(lay, len(picks) * cp * w, w, ep, bool(moe_layers) and replan is None)
    widths = [[min(tps[s] for s in g) for g in groups] for _, tps, _ in picks]
    # sequences per micro-batch: every copy of every block needs one
    mb = math.lcm(*(w // t for d in chunk_degrees for t in d))
    run_micro = _run_micro([n / lay.num_micro_batches for *_, n in picks], lay.num_micro_batches, pp, vpp)
    degrees = {t for d in chunk_degrees for t in d} | {x for ws in widths for x in ws}
    degrees |= {x - k for ws in widths for x in ws for k in range(1, min(failures, x - 1) + 1)}
    # every cp chunk needs a token, and a token per rank under sequence parallelism
    seq_len = max(seq_len, cp * (w if lay.sequence_parallel else 1))
    layer_count = sum(len(d) for d in chunk_degrees) - 2
    cfg = _tiny_config(model, math.lcm(*degrees), w, ep, moe_layers, layer_count, seq_len)
    # ZeRO-3 gathers every micro-batch over the replicas: they must hold each block alike, as often
    uniform = all(ws == widths[0] for ws in widths) and len(set(run_micro)) == 1
    zero = 0 if hosted else 2 if lay.zero == 3 and not uniform else lay.zero  # hosting holds experts whole
    if hosted:
        ranks, hosting, host_notes = _hosted(plan, replan, groups, picks, widths, cp, cfg.experts)
    else:
        ranks, hosting, host_notes = _placed(plan, replan, groups, picks, widths, cp), (), []
    run = RunShape(pp, cp, seq_len, groups, mb, run_micro, vpp, ep, zero, bool(hosting))
    notes = shrink_notes(plan, cfg, run, picks, replan, nproc, wanted_replicas(lay, failures)) + cut + fold_note
    notes += host_notes
    spec = make_spec(
        cfg,
        chunk_degrees,
        [(ws, k) for ws, k in zip(widths, run_micro, strict=True)],
        mb,
        seq_len,
        width=w,
        cp=cp,
        vpp=vpp,
        steps=steps,
        seed=seed,
        recompute=lay.recompute,
        sequence_parallel=lay.sequence_parallel,
        notes=tuple(notes),
        ep=ep,
        etp=1 if hosting else etp,
        zero=zero,
        reshard_after_forward=lay.reshard_after_forward if zero == 3 else True,
        hosting=hosting,
    )
    return Shrunk(spec, ranks, tuple(p[0] for p in picks), tuple(groups))


def _picks(plan: Plan, replan: ReplanResult | None, failures: int = 0) -> list[tuple[int, list[int], int]]:
    """(plan replica, stage widths, micro-batches) of the replicas worth running: the healthy
    plan's first ``wanted_replicas``, or one replica of each kind a re-plan made (healthy first),
    and a second replica when the re-plan made only one kind."""
    lay, w, micro = plan.layout, plan.layout.tp, plan.layout.num_micro_batches
    if replan is None:
        return [(r, [w] * lay.pp, micro) for r in range(lay.dp)][: wanted_replicas(lay, failures)]
    active = [
        (x.replica, list(x.stage_tp), x.local_batch // lay.micro_batch)
        for x in replan.replicas
        if x.status != "dropped"
    ]
    if not active:
        raise ValueError("every replica of the re-plan is dropped; there is nothing to run")
    kinds: dict = {}
    for rep in sorted(active, key=lambda x: (min(x[1]) != w, x[0])):  # healthy first
        kinds.setdefault((tuple(rep[1]), rep[2]), rep)
    picks = list(kinds.values())
    if len(picks) == 1 and len(active) > 1:
        picks.append(next(x for x in active if x is not picks[0]))
    return picks


def _run_micro(ratios: list[float], micro: int, pp: int, vpp: int) -> list[int]:
    """Micro-batches of each run replica: the plan's, at most max(2 pp, 2), in multiples of pp
    under interleaving (``spec.check``), each replica's share of the batch kept."""
    unit = pp if vpp > 1 else 1
    m = min(micro, max(2 * pp, 2)) // unit * unit
    if any(r < 1 for r in ratios):
        m = max(m, 2 * unit)
    return [scaled_micro_batches(r, m, unit) for r in ratios]


def _tiny_config(model, modulus: int, w: int, ep: int, moe_layers: tuple[int, ...], layers: int, seq_len: int):
    """The shrunk decoder: the plan's heads and KV heads, FFN width and vocabulary with their
    remainders modulo every degree in use, the block style, the experts (``_experts``)."""
    head_dim = 4 if model.num_heads <= 32 else 2
    return TinyConfig(
        vocab=_same_remainder(model.vocab_size, modulus, 64),
        hidden=model.num_heads * head_dim,
        layers=layers,
        heads=model.num_heads,
        kv_heads=model.num_kv_heads,
        ffn=_same_remainder(model.ffn_hidden_size, modulus, max(64, 4 * w)),
        **block_style(model),
        max_positions=seq_len,
        **_experts(model, modulus, w, ep, moe_layers),
    )


def _placed(plan: Plan, replan, groups, picks, widths, cp: int, stages=None) -> tuple[tuple[int, int | None], ...]:
    """Per run process (stage-major, then replica, cp chunk, TP rank): the plan rank it stands
    for and that rank's GPU (the re-plan's when there is one), on the first plan stage merged
    into its run stage, or on ``stages[j]`` for run stage j (``hosted.run_stages``)."""
    ranks, grid = [], plan.layout.rank_grid
    gpus = plan.placement if replan is None else replan.rank_to_gpu
    for j, g in enumerate(groups):
        for (r, *_), ws in zip(picks, widths, strict=True):
            for c in range(cp):
                for i in range(ws[j]):
                    plan_rank = grid.rank(tp=i, cp=c, dp=r, pp=g[0] if stages is None else stages[j])
                    ranks.append((plan_rank, gpus[plan_rank]))
    return tuple(ranks)


def _chunk_degrees(
    plan: Plan, groups: list[tuple[int, ...]], vpp: int
) -> tuple[list[list[int]], list[str], list[bool]]:
    """TP degrees of the run's model chunks, in model order, from the plan's ``pipeline``. With
    the plan's vpp kept, run chunk v * pp + j holds the plan's chunks v * P + s of the plan
    stages s merged into run stage j (consecutive in model order, so the layers stay in order);
    with vpp 1 a run stage holds its plan stages' chunks, in model order. Each chunk keeps one
    layer per run of equal degrees (two when it has several layers at one degree), at most
    ``MAX_LAYERS_PER_STAGE / vpp``; a run also ends where the layer kind (dense or MoE)
    changes. Also returned: a note for every chunk cut by that cap, and whether each of the
    run's layers (in model order) is MoE.

    >>> from cost_models.catalogue import MODELS
    >>> from cost_models.layout import ParallelLayout
    >>> from cost_models.training import TrainingSpec
    >>> from ntp_planner.solver.planner import plan_from_layout
    >>> from topologies.cluster import Cluster
    >>> from topologies.cluster_catalogue import CLUSTERS
    >>> lay = ParallelLayout(tp=4, pp=2, vpp=2, global_batch=8, layer_tp=(4,) + (2,) * 4 + (4,) * 4 + (1,) * 8 + (4,))
    >>> p = plan_from_layout(MODELS["llama3-8b"].model_copy(update={"num_layers": 16}), TrainingSpec(seq_len=2048,
    ...     global_batch=8), Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8), lay)
    >>> [c.tp for c in p.pipeline]
    [[4, 2, 2, 2, 2], [4, 4, 4, 4], [1, 1, 1, 1], [1, 1, 1, 1, 4]]
    >>> _chunk_degrees(p, [(0,), (1,)], 2)[0], _chunk_degrees(p, [(0, 1)], 1)[0]
    ([[4, 2, 2], [4, 4], [1, 1], [1, 1, 4]], [[4, 2, 4, 1, 4]])
    """
    P, V, chunks, model = plan.layout.pp, plan.layout.vpp, plan.pipeline, plan.model
    held = [[chunks[v * P + s] for s in g] for v in range(vpp) for g in groups] if vpp > 1 else []
    held = held or [[chunks[v * P + s] for v in range(V) for s in range(P) if s in g] for g in groups]
    out, cut, moe = [], [], []
    for i, parts in enumerate(held):
        # (TP degree, MoE layer) of every block, embedding and LM head dense
        merged = [
            (t, c.embedding <= b < len(c.tp) - c.loss and model.is_moe_layer(c.layers[b - c.embedding]))
            for c in parts
            for b, t in enumerate(c.tp)
        ]
        first, last = i == 0, i == len(held) - 1
        body = merged[1 if first else 0 : len(merged) - 1 if last else len(merged)]
        runs = _runs(body)[: max(1, MAX_LAYERS_PER_STAGE // vpp)]
        if len(runs) < len(_runs(body)):
            j = i % len(groups)
            degrees = [t for t, _ in _runs(body)]
            cut.append(
                cut_runs_note(j, groups[j], degrees, degrees[: len(runs)], i // len(groups) if vpp > 1 else None)
            )
        if len(runs) == 1 and len(body) > 1:
            runs *= 2
        out.append([merged[0][0]] * first + [t for t, _ in runs] + [merged[-1][0]] * last)
        moe += [is_moe for _, is_moe in runs]
    return out, cut, moe


def _hosted(plan: Plan, replan, groups, picks, widths, cp: int, experts: int):
    """(process -> plan rank and GPU, the run's expert hosting, its notes) of a run that hosts the
    re-plan's re-hosted experts: each run stage on the plan stage whose EP groups it holds."""
    stages = run_stages(groups, picks, widths)
    ranks = _placed(plan, replan, groups, picks, widths, cp, stages)
    rank_of = {plan_rank: process for process, (plan_rank, _) in enumerate(ranks)}
    notes = hosting_notes(replan, stages, rank_of, experts, plan.model.num_experts, plan.layout.ep)
    return ranks, run_hosting(plan, replan, stages, rank_of, experts), notes


def _ep(lay, picks: list, cp: int, replan) -> tuple[int, list]:
    """The run's ep (the largest divisor of the plan's that the run's pipelines, replicas x cp,
    can hold whole groups of) and the replicas kept for it (a multiple of ep / gcd(ep, cp)).
    Replicas of different widths (NTP) run without EP (``spec._check_moe`` says why), unless the
    re-plan re-hosts experts: then explicit hosting runs them at the plan's ep (``hosted``)."""
    if lay.ep == 1 or len({tuple(p[1]) for p in picks}) > 1:
        return 1, picks
    for d in sorted((d for d in range(1, lay.ep + 1) if lay.ep % d == 0), reverse=True):
        keep = max((k for k in range(1, len(picks) + 1) if k * cp % d == 0), default=0)
        if keep:
            return d, picks[:keep]
    return 1, picks


def _folding(lay, ranks: int, w: int, ep: int, moe: bool) -> tuple[int | None, int, list[str]]:
    """(etp, ep, notes) of the run of a folded plan (``lay.folded``: experts on an etp x ep x edp
    grid of their own): the plan's etp where it divides the run's TP width, with the largest
    divisor of the plan's ep whose grid the run's ``ranks`` per stage hold (EP then spans TP
    ranks, as the plan's); ZeRO and re-plans keep the layout before folding (etp = tp).

    >>> from cost_models.layout import ParallelLayout
    >>> etp, ep, (note,) = _folding(ParallelLayout(tp=2, dp=4, ep=4, etp=1, global_batch=8), 4, 2, 2, True)
    >>> etp, ep, note
    (1, 4, "etp 1 kept (parallel folding): experts on an etp 1 x ep 4 grid of each stage's 4 ranks")
    """
    if not (moe and lay.folded):
        return None, ep, []
    if lay.zero or w % lay.etp:
        why = f"ZeRO {lay.zero} beside folding is not run" if lay.zero else f"it does not divide the run's TP {w}"
        return None, ep, [f"etp {lay.etp} -> the layout before folding (etp = tp {w}): {why}"]
    d = max(d for d in range(1, lay.ep + 1) if lay.ep % d == 0 and ranks % (lay.etp * d) == 0)
    grid = f"etp {lay.etp} x ep {d} grid of each stage's {ranks} ranks"
    return lay.etp, d, [f"etp {lay.etp} kept (parallel folding): experts on an {grid}"]


def _experts(model, modulus: int, w: int, ep: int, moe_layers: tuple[int, ...]) -> dict:
    """TinyConfig's MoE fields: at most MAX_EXPERTS experts, a whole number per EP rank and at
    least two (with one, a rank's tokens never need sorting among its experts, so that code would
    go unchecked: Mixtral's 8 at ep 8 run as 16), top-k kept (at most the experts), widths with
    the plan's remainders modulo every degree."""
    if not model.num_experts or not moe_layers:
        return {}
    style = block_style(model)
    if style["mlp"] != "swiglu" or style["bias"]:
        raise InputError(
            f"the plan's model {model.name} has MoE layers with a {style['mlp']} MLP"
            + (" and linear biases" if style["bias"] else "")
            + "; ntp validate runs experts as SwiGLU without biases (Mixtral's, DeepSeek's), so it cannot run this plan"
        )
    # ep divides the plan's experts, so min(experts, MAX_EXPERTS) // ep is whole experts of each
    experts = ep * max(2, min(model.num_experts, MAX_EXPERTS) // ep)
    shared = model.moe_shared_ffn_hidden_size
    return {
        "experts": experts,
        "top_k": min(model.moe_top_k, experts),
        "expert_ffn": _same_remainder(model.moe_ffn_hidden_size, modulus, max(16, 2 * w)),
        "moe_layers": moe_layers,
        "shared_ffn": _same_remainder(shared, modulus, max(16, 2 * w)) if shared else 0,
    }
