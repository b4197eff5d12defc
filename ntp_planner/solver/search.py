"""Exhaustive search over uniform layouts, ranked by predicted step time.

The space searched is exactly ``SearchSpace``: every combination of its candidate values that
passes ``check_layout`` and fits memory, each at the first ZeRO level of ``zeros`` that fits
(sharding more of the model state only adds communication, so a layout escalates only when
memory asks). Nothing inside that space is pruned by heuristics, so the search equals
brute-force enumeration (tests/ntp_planner/solver/test_search.py checks this).
"""

from __future__ import annotations

from itertools import product

from pydantic import BaseModel, ConfigDict, Field

from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.layout import ParallelLayout, Recompute
from cost_models.model import ModelSpec
from cost_models.step import StepCost, cost_env, cost_from_stages, layout_stages, stage_memory
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster
from topologies.errors import InputError

CP_FROM_TOKENS = {2: 8192, 4: 32768, 8: 32768}  # smallest sequence at which each cp degree is tried


class SearchSpace(BaseModel):
    """Candidate values per axis. tp, pp, cp and ep are further restricted to the values that
    divide what they must divide; dp is whatever GPUs remain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batches: tuple[int, ...] = Field(default=(1, 2, 4, 8), description="Micro-batch sizes tried.")
    vpps: tuple[int, ...] = Field(default=(1, 2, 4), description="Virtual stages tried when pp > 1.")
    recomputes: tuple[Recompute, ...] = Field(default=("none", "selective", "full"))
    cps: tuple[int, ...] | None = Field(
        default=None, description="Context-parallel degrees; None = 1, plus 2 from 8K tokens, plus 4 and 8 from 32K."
    )
    max_pp: int = Field(default=128, description="Largest pipeline degree tried.")
    zeros: tuple[int, ...] = Field(
        default=(1, 2, 3),
        min_length=1,
        description="ZeRO levels tried in order, the first that fits kept (when the training allows sharding and "
        "dp x cp > 1): 1 the distributed optimizer, 2 also gradients, 3 also parameters (FSDP).",
    )


class Candidate(BaseModel):
    """A ranked layout and its predicted cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layout: ParallelLayout
    cost: StepCost


class SearchResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ranked: list[Candidate] = Field(description="Layouts that fit, fastest first.")
    evaluated: int = Field(description="Valid layouts costed.")
    rejected_memory: int = Field(description="Valid layouts that did not fit memory.")
    least_memory: Candidate | None = Field(description="The valid layout needing least memory.")
    notes: list[str] = Field(default_factory=list, description="Candidates the inputs ruled out or changed, and why.")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_degrees(model: ModelSpec, domain: int) -> list[int]:
    """TP degrees the search tries: divisors of the NVLink domain that divide the heads and the
    FFN width, and divide the KV heads or are a multiple of them (KV heads then replicate).

    >>> from cost_models import MODELS
    >>> tp_degrees(MODELS["llama3-8b"], 16), tp_degrees(MODELS["megatron-1.7b"], 16)  # 24 heads: not 16
    ([1, 2, 4, 8, 16], [1, 2, 4, 8])
    """
    return [
        t
        for t in divisors(domain)
        if model.num_heads % t == 0
        and model.ffn_hidden_size % t == 0
        and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)
    ]


def enumerate_layouts(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    space: SearchSpace = SearchSpace(),
    notes: list[str] | None = None,
) -> list[ParallelLayout]:
    """Every layout of ``space`` that obeys the model/cluster divisibility rules. TP degrees
    divide the job's NVLink domains (``tp_domain_size``), so every TP group stays in one.
    Sequence parallelism is on wherever tp > 1 and the sequence chunk divides over the TP ranks;
    where it does not (an odd ``seq_len``), a dense layout runs TP without it and an MoE one is
    skipped (Megatron needs sequence parallelism beside TP in MoE layers); ``notes`` gets one
    line for each such TP degree."""
    n, domain, batch = cluster.num_gpus, cluster.tp_domain_size, training.global_batch
    tps = tp_degrees(model, domain)
    cps = space.cps or (1, *[c for c, s in CP_FROM_TOKENS.items() if training.seq_len >= s])
    out = []
    for tp, cp in product(tps, cps):
        if n % (tp * cp) or (cp > 1 and training.seq_len % (2 * cp)):
            continue
        sp = tp > 1 and (training.seq_len // cp) % tp == 0
        if tp > 1 and not sp:
            _sequence_note(notes, model, training.seq_len, tp, cp)
            if model.is_moe:
                continue
        for pp in divisors(n // (tp * cp)):
            if pp > min(model.num_layers, space.max_pp):
                break
            dp = n // (tp * cp * pp)
            for mb, vpp, rc, expert in product(
                space.micro_batches, space.vpps, space.recomputes, expert_grids(model, tp, cp, dp, domain)
            ):
                if batch % (mb * dp):
                    continue
                if vpp > 1 and (pp == 1 or pp * vpp > model.num_layers or (batch // (mb * dp)) % pp):
                    continue  # every chunk needs a layer; interleaving needs micro-batches % pp == 0
                out.append(
                    ParallelLayout(
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        cp=cp,
                        micro_batch=mb,
                        global_batch=batch,
                        vpp=vpp,
                        sequence_parallel=sp,
                        recompute=rc,
                        zero=first_zero(training, space, dp * cp),
                        **expert,
                    )
                )
    return out


def _sequence_note(notes: list[str] | None, model: ModelSpec, seq_len: int, tp: int, cp: int) -> None:
    if notes is None:
        return
    chunk = f"seq_len {seq_len}" + (f" / cp {cp}" if cp > 1 else "")
    done = (
        "skipped: MoE layers need sequence parallelism beside TP"
        if model.is_moe
        else "run without sequence parallelism"
    )
    line = f"{chunk} does not divide over tp {tp}: its layouts are {done} (a multiple of {tp * cp} allows it)"
    if line not in notes:
        notes.append(line)


def expert_grids(model: ModelSpec, tp: int, cp: int, dp: int, domain: int) -> list[dict]:
    """The experts' grids tried over a stage's ``tp x cp x dp`` ranks, as layout fields: expert
    TP ``etp`` in {tp, 1} (1 folds EP over the attention's TP ranks, Megatron's parallel folding;
    one value when tp is 1), EP every divisor of ``tp * cp * dp / etp`` that divides the experts,
    and the dispatcher the EP group calls for (``moe_dispatcher``). Experts with biases (GPT-OSS)
    take etp 1 only: megatron-core builds them at no other ("Bias in Moe is only supported when
    ETP==1"). A dense model has one grid: no fields, so its layouts are those of before folding.

    >>> from cost_models import MODELS
    >>> [(g.get("etp"), g["ep"]) for g in expert_grids(MODELS["mixtral-8x7b"], 2, 1, 2, 8)]
    [(None, 1), (None, 2), (1, 1), (1, 2), (1, 4)]
    """
    if not model.is_moe:
        return [{}]
    grids = []
    for etp in dict.fromkeys((1,) if model.bias else (tp, 1)):
        for ep in divisors(tp * cp * dp // etp):
            if model.num_experts % ep == 0:
                fields = {"ep": ep, "moe_dispatcher": dispatcher(etp, ep, domain)}
                grids.append(fields if etp == tp else {**fields, "etp": etp})
    return grids


def dispatcher(etp: int, ep: int, domain: int) -> str:
    """The token dispatcher for an EP group of ``ep`` ranks ``etp`` apart: 'flex' (DeepEP /
    HybridEP: NVLink inside the domain, one copy per node across it) when the group spans more
    ranks than an NVLink domain holds, else Megatron's default 'alltoall', all on NVLink. A
    stage's ranks are consecutive and the expert grid numbers them etp fastest, so an EP group
    spans ``etp * ep`` consecutive ranks (``RankGrid.expert_group``); domains are aligned.

    >>> dispatcher(1, 8, 8), dispatcher(2, 8, 8), dispatcher(8, 1, 8)
    ('alltoall', 'flex', 'alltoall')
    """
    return "flex" if etp * ep > domain else "alltoall"


def first_zero(training: TrainingSpec, space: SearchSpace, dp_shards: int) -> int:
    """The ZeRO level a layout starts at: the first of ``space.zeros``, or 0 when the training
    forbids sharding or no rank shares the model state."""
    return space.zeros[0] if training.distributed_optimizer and dp_shards > 1 else 0


def escalations(layout: ParallelLayout, space: SearchSpace) -> list[ParallelLayout]:
    """The layout at each later ZeRO level of ``space.zeros``, in order."""
    if layout.zero == 0 or layout.zero not in space.zeros:
        return []
    later = space.zeros[space.zeros.index(layout.zero) + 1 :]
    return [layout.model_copy(update={"zero": z}) for z in later]


def search(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    headroom: float = 0.1,
    space: SearchSpace = SearchSpace(),
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    pass_caches: dict | None = None,
) -> SearchResult:
    """Cost every layout in ``space``; keep those whose memory fits HBM x (1 - headroom).
    Layouts that differ only in pp, dp and vpp share block passes (in ``pass_caches`` when
    given, so a later search can reuse them)."""
    pass_caches = {} if pass_caches is None else pass_caches
    fitting, rejected, least, notes = [], 0, None, []
    layouts = enumerate_layouts(model, training, cluster, space, notes)
    usable = cluster.gpu.hbm_bytes * (1 - headroom)
    for base in layouts:
        levels = [base, *escalations(base, space)]
        for layout in levels:
            # memory first: only the ZeRO level that fits (or the last one tried) is costed in full
            env = cost_env(model, training, layout, cluster, efficiency, pass_caches)
            stages = layout_stages(env)
            fits = max(sum(parts.values()) for parts in stage_memory(env, stages)) <= usable
            if fits or layout is levels[-1]:
                cost = cost_from_stages(env, stages)
                break
        cand = Candidate(layout=layout, cost=cost)
        if least is None or cost.memory_per_gpu_bytes < least.cost.memory_per_gpu_bytes:
            least = cand
        if cost.fits(headroom):
            fitting.append(cand)
        else:
            rejected += 1
    fitting.sort(key=lambda c: (c.cost.step_time_s, c.cost.memory_per_gpu_bytes, c.layout.describe()))
    return SearchResult(
        ranked=fitting, evaluated=len(layouts), rejected_memory=rejected, least_memory=least, notes=notes
    )


class NoLayoutFits(InputError):
    """The inputs are valid but no layout of the search fits memory (or exists at all): the CLI
    exits with code 3, not bad input's 2, so a script can tell "buy more GPUs" from a typo."""

    exit_code = 3


def no_fit_message(result: SearchResult, model: ModelSpec, cluster: Cluster, headroom: float) -> str:
    """One sentence: why nothing fits, on which stage, and by how much the leanest layout misses.
    (The leanest uniform layout is also the leanest per-layer one: a stage's memory is smallest
    with every block at the widest degree.)"""
    if result.least_memory is None:
        return (
            f"no valid layout of {model.name} exists on {cluster.num_gpus} GPUs of {cluster.spec.name}: "
            "check that the GPU count and global batch divide evenly"
        )
    c = result.least_memory
    usable = c.cost.hbm_bytes * (1 - headroom)
    stage = max(range(len(c.cost.stage_memory_bytes)), key=c.cost.stage_memory_bytes.__getitem__)
    missing = c.cost.memory_per_gpu_bytes - usable
    return (
        f"{model.name} fits no layout on {cluster.num_gpus} x {cluster.gpu.name}: the leanest, "
        f"{c.layout.describe()}, needs {c.cost.memory_per_gpu_bytes / 2**30:.1f} GiB per GPU on stage {stage} "
        f"(its tightest) but {usable / 2**30:.1f} GiB is usable ({c.cost.hbm_bytes / 2**30:.0f} GiB x "
        f"(1 - headroom {headroom:g})), {missing / 2**30:.1f} GiB short ({missing:,.0f} bytes); "
        "add GPUs, shorten the sequence or keep less memory free (headroom)"
    )
