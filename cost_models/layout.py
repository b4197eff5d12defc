"""ParallelLayout: HOW a model is spread over GPUs, and the rules a layout must obey.

It lives in cost_models because the step estimator reads it, and ntp_planner (which searches
over layouts) imports it from here; the dependency arrow points one way.

Rank order: one rule, defined once by ``cost_models.rank_grid.RankGrid`` (``layout.rank_grid``,
with its worked 8-GPU example): ``tp`` varies fastest, then ``cp``, ``dp``, ``pp``, as Megatron's
default "tp-cp-ep-dp-pp" (``ep`` takes consecutive ranks of the flattened ``cp x dp`` ranks).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from cost_models.model import MAX_LAYERS, ModelSpec
from cost_models.pipeline_layout import (
    chunks_from_stages,
    describe_chunks,
    even_split,
    stage_chunk_spans,
    stage_totals,
)
from cost_models.rank_grid import RankGrid
from cost_models.training import MAX_GLOBAL_BATCH, TrainingSpec
from topologies.bounds import Bound, bounds_validator
from topologies.cluster import MAX_GPUS
from topologies.errors import InputError

Recompute = Literal["none", "selective", "full"]
Dispatcher = Literal["alltoall", "allgather", "flex"]
MoeOverlap = Literal["none", "1f1b", "dualpipe"]
RecomputeModule = Literal["mla_up_proj", "mlp", "moe_act", "layernorm"]
Zero = Literal[0, 1, 2, 3]
MAX_CHUNKS = MAX_LAYERS + 2  # one layer per chunk, the embedding and the loss alone in the first and last
_DEGREE = Bound(1, MAX_GPUS, "GPUs", "a degree cannot exceed the GPUs a cluster may hold (MAX_GPUS)")
_BATCH = Bound(1, MAX_GLOBAL_BATCH, "sequences", "published runs step 1,000 to 16,000 sequences")
_BOUNDS: dict[str, Bound] = {
    "tp": _DEGREE,
    "pp": _DEGREE,
    "dp": _DEGREE,
    "cp": _DEGREE,
    "ep": _DEGREE,
    "etp": _DEGREE,
    "micro_batch": _BATCH,
    "global_batch": _BATCH,
    "vpp": Bound(1, MAX_LAYERS, "chunks per stage", "every chunk but the first and last holds a layer"),
}


class ParallelLayout(BaseModel):
    """Degrees of every parallel axis plus batching and memory-saving choices."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    tp: int = Field(default=1, ge=1, description="Tensor-parallel degree (inside one NVLink domain).")
    pp: int = Field(default=1, ge=1, description="Pipeline stages.")
    dp: int = Field(default=1, ge=1, description="Data-parallel replicas.")
    cp: int = Field(default=1, ge=1, description="Context-parallel degree (sequence split for attention).")
    ep: int = Field(default=1, ge=1, description="Expert-parallel degree, carved out of dp x cp.")
    etp: int | None = Field(
        default=None,
        ge=1,
        description="Expert tensor-parallel degree: ranks splitting each expert's matrices. None = tp (experts "
        "split over the attention's TP ranks); 1 with ep > 1 folds EP over the TP ranks (Megatron's parallel "
        "folding: experts on an etp x ep x edp grid over the same GPUs, RankGrid.expert_group).",
    )
    moe_dispatcher: Dispatcher = Field(
        default="alltoall",
        description="How MoE tokens reach their experts: 'alltoall' (Megatron's default), 'allgather' (every EP "
        "rank gathers all tokens and keeps its experts' share), 'flex' (DeepEP / HybridEP: NVLink inside the "
        "domain, one copy per node across it).",
    )
    moe_overlap: MoeOverlap = Field(
        default="none",
        description="Overlap of MoE dispatch and combine with compute: 'none', '1f1b' (Megatron's "
        "--overlap-moe-expert-parallel-comm: one micro-batch's all-to-all under another's compute), "
        "'dualpipe' (DeepSeek-V3's bidirectional schedule).",
    )
    micro_batch: int = Field(default=1, ge=1, description="Sequences per micro-batch.")
    global_batch: int = Field(gt=0, description="Sequences per optimizer step.")
    vpp: int = Field(default=1, ge=1, description="Virtual (interleaved) stages per pipeline rank.")
    sequence_parallel: bool = Field(default=False, description="Shard norms/dropout over TP (needs tp > 1).")
    recompute: Recompute = Field(default="none", description="Activation recomputation granularity.")
    recompute_modules: tuple[RecomputeModule, ...] = Field(
        default=(),
        max_length=4,
        description="Megatron's selective recompute_modules besides core attention (which recompute "
        "'selective' means): 'mla_up_proj' (MLA's up-projections: Q, K, V not saved), 'mlp' (dense MLPs: only "
        "their input kept), 'moe_act' (the experts' activation: the down-projection input not saved), "
        "'layernorm' (the two norms: their outputs not saved). Each is charged its forward again in backward.",
    )
    zero: Zero = Field(
        default=0,
        description="How model state is sharded over the data-parallel group dp x cp: 0 replicated, 1 optimizer "
        "state (Megatron's distributed optimizer), 2 also gradients, 3 also parameters (FSDP).",
    )
    reshard_after_forward: bool = Field(
        default=True,
        description="ZeRO-3: free gathered parameters after forward and gather them again for backward; False "
        "keeps them until backward (more memory, one all-gather per micro-batch fewer).",
    )
    chunk_layers: tuple[int, ...] | None = Field(
        default=None,
        max_length=MAX_CHUNKS,
        description="Transformer layers in each model chunk, in model order (pp * vpp entries): chunk c runs on "
        "stage c % pp as its virtual chunk c // pp; the embedding is in chunk 0, the loss in the last. "
        "None = an even split, leading chunks one more.",
    )
    overlap_grad_reduce: bool = Field(default=True, description="Overlap the DP gradient reduction with backward.")
    tp_comm_overlap: bool = Field(default=False, description="Overlap TP collectives with GEMMs (userbuffers).")
    overlap_p2p: bool = Field(default=True, description="Overlap pipeline sends/receives with compute.")
    p2p_scatter_gather: bool = Field(
        default=False,
        description="Split each pipeline send over the tp ranks and all-gather it over NVLink on arrival "
        "(Megatron-LM before Megatron-Core; Narayanan et al. 2021, section 4.1). Sequence parallelism "
        "splits the sends anyway.",
    )
    layer_tp: tuple[int, ...] | None = Field(
        default=None,
        max_length=MAX_LAYERS + 2,
        description="Per-block TP degrees (embedding, each layer, LM head), each dividing tp, which is then "
        "the stage width; None = every block at tp. A block at degree t runs tp/t copies inside the stage.",
    )

    _bounds = bounds_validator(_BOUNDS)

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data):
        """``distributed_optimizer=True`` means zero 1; ``pp_layers`` (layers per stage) becomes
        ``chunk_layers``, each stage's layers split evenly over its virtual chunks."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "distributed_optimizer" in data:
            flag = data.pop("distributed_optimizer")
            if "zero" not in data:
                data["zero"] = 1 if flag else 0
        stages = data.pop("pp_layers", None)
        if stages is not None and data.get("chunk_layers") is None:
            pp, vpp = data.get("pp", 1), data.get("vpp", 1)
            if not isinstance(stages, list | tuple) or len(stages) != pp:
                size = len(stages) if isinstance(stages, list | tuple) else "?"
                raise InputError(f"pp_layers has {size} entries but pp = {pp}")
            if isinstance(vpp, int) and vpp >= 1 and all(isinstance(n, int) for n in stages):
                data["chunk_layers"] = chunks_from_stages(tuple(stages), vpp)
        return data

    @model_serializer(mode="wrap")
    def _omit_unset_modules(self, handler):
        """Dumps leave ``recompute_modules`` out while it is empty: it came after plans and their
        exports were first written (``ntp_planner.plan.LATER_FIELDS``), which stay as they were."""
        data = handler(self)
        if not self.recompute_modules and isinstance(data, dict):
            data.pop("recompute_modules", None)
        return data

    @model_validator(mode="after")
    def _check(self) -> ParallelLayout:
        if self.world_size > MAX_GPUS:
            raise InputError(
                f"tp({self.tp}) * cp({self.cp}) * dp({self.dp}) * pp({self.pp}) = {self.world_size:,} GPUs is more "
                f"than a cluster may hold ({MAX_GPUS:,}); lower the degrees"
            )
        if self.pp * self.vpp > MAX_CHUNKS:
            raise InputError(
                f"pp({self.pp}) * vpp({self.vpp}) = {self.pp * self.vpp:,} model chunks is more than a model can fill "
                f"({MAX_CHUNKS:,}: {MAX_LAYERS:,} layers, the embedding and the loss); lower pp or vpp"
            )
        if self.sequence_parallel and self.tp == 1:
            raise InputError("sequence parallelism needs tp > 1; set sequence_parallel false or tp above 1")
        if self.global_batch % (self.micro_batch * self.dp):
            raise InputError(
                f"global_batch({self.global_batch}) is not divisible by micro_batch({self.micro_batch}) * "
                f"dp({self.dp}) = {self.micro_batch * self.dp}; micro-batches per step must be whole"
            )
        if self.vpp > 1 and self.pp == 1:
            raise InputError(f"interleaving (vpp={self.vpp}) needs pp > 1")
        if self.recompute_modules and self.recompute == "full":
            raise InputError(
                f"recompute_modules {list(self.recompute_modules)} select parts of a layer to recompute, but "
                "recompute 'full' already recomputes it all; drop the modules or set recompute 'none' or 'selective'"
            )
        if len(set(self.recompute_modules)) != len(self.recompute_modules):
            raise InputError(f"recompute_modules {list(self.recompute_modules)} names a module twice")
        if not self.reshard_after_forward and self.zero < 3:
            raise InputError(
                f"keeping weights after forward only applies to ZeRO-3 (this layout is ZeRO-{self.zero}); "
                "set reshard_after_forward true or zero 3"
            )
        if self.chunk_layers is not None:
            chunks = self.pp * self.vpp
            if len(self.chunk_layers) != chunks:
                raise InputError(
                    f"chunk_layers has {len(self.chunk_layers)} entries but pp({self.pp}) * vpp({self.vpp}) = {chunks}"
                )
            if min(self.chunk_layers) < 0:
                c = min(range(len(self.chunk_layers)), key=self.chunk_layers.__getitem__)
                raise InputError(
                    f"a chunk cannot hold a negative number of layers: chunk_layers[{c}] = {self.chunk_layers[c]}"
                )
            empty = [s for s, n in enumerate(stage_totals(self.chunk_layers, self.pp)) if n == 0]
            if empty:
                raise InputError(f"every pipeline stage needs at least one layer; stage(s) {empty[:5]} hold none")
        if self.layer_tp is not None:
            bad = [(b, t) for b, t in enumerate(self.layer_tp) if t < 1 or self.tp % t]
            if bad:
                block, t = bad[0]
                raise InputError(
                    f"layer_tp: block {block} has degree {t}, which does not divide the stage width tp({self.tp}); "
                    "every per-block degree must divide tp"
                )
        return self

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def rank_grid(self) -> RankGrid:
        """The rank order of this layout (tp fastest, then cp, dp, pp)."""
        return RankGrid(tp=self.tp, cp=self.cp, dp=self.dp, pp=self.pp)

    @property
    def expert_tp(self) -> int:
        """The expert tensor-parallel degree (``etp``, or ``tp`` when unset)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel degree: tp * cp * dp / (etp * ep)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def folded(self) -> bool:
        """The experts use a grid of their own (etp differs from tp)."""
        return self.expert_tp != self.tp

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches each pipeline runs per step: global / (micro * dp)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def distributed_optimizer(self) -> bool:
        """Optimizer state is sharded over the data-parallel group (ZeRO-1 or more)."""
        return self.zero >= 1

    def chunks(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers of every model chunk (model order, pp * vpp entries).

        >>> ParallelLayout(pp=2, vpp=2, global_batch=8).chunks(10)
        (3, 3, 2, 2)
        """
        if self.chunk_layers is not None:
            return self.chunk_layers
        return even_split(num_layers, self.pp * self.vpp)

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers on each pipeline stage (the sum of its chunks).

        >>> ParallelLayout(pp=4, global_batch=8).stage_layers(10)
        (3, 3, 2, 2)
        """
        return stage_totals(self.chunks(num_layers), self.pp)

    def stage_chunks(self, stage: int, num_layers: int) -> list[tuple[int, int, int]]:
        """(chunk index, first layer, layer count) of every chunk stage ``stage`` holds, in the
        order the stage runs them for one micro-batch.

        >>> ParallelLayout(pp=2, vpp=2, global_batch=8).stage_chunks(1, 10)
        [(1, 3, 3), (3, 8, 2)]
        """
        return stage_chunk_spans(self.pp, self.vpp, self.chunk_layers, stage, num_layers)

    def block_tp(self, num_layers: int) -> tuple[int, ...]:
        """Degree of every block: [embedding, layer 0 .. layer L-1, LM head]."""
        return self.layer_tp if self.layer_tp is not None else (self.tp,) * (num_layers + 2)

    @property
    def is_per_layer(self) -> bool:
        return self.layer_tp is not None and any(t != self.tp for t in self.layer_tp)

    def describe(self) -> str:
        """Compact one-line form, e.g. 'tp8 pp4 dp32 mb1 vpp2 sp rc-full zero1'; per-layer
        degrees show as 'tp2-8/8' (degrees 2 to 8 in stages of 8), uneven splits as
        'pp4(19/20/21/20)' (or 'pp16(uneven)' beyond 8 stages), and interleaved chunks that are
        not an even split as 'pp8(chunks 1/2*62/1)'.

        >>> ParallelLayout(pp=2, dp=4, global_batch=8, pp_layers=(3, 5)).describe()
        'tp1 pp2(3/5) dp4 mb1'
        """
        pp = f"pp{self.pp}"
        if self.chunk_layers is not None:
            stages = stage_totals(self.chunk_layers, self.pp)
            if self.vpp > 1 and self.chunk_layers != chunks_from_stages(stages, self.vpp):
                pp += f"(chunks {describe_chunks(self.chunk_layers)})"
            elif len(set(stages)) > 1:
                pp += f"({'/'.join(map(str, stages))})" if self.pp <= 8 else "(uneven)"
        parts = [
            f"tp{self.tp}" if not self.is_per_layer else f"tp{_degree_summary(self.layer_tp)}/{self.tp}",
            pp,
            f"dp{self.dp}",
        ]
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"etp{self.expert_tp}"] if self.folded else []
        parts += [f"moe-{self.moe_dispatcher}"] if self.moe_dispatcher != "alltoall" else []
        parts += [f"a2a-{self.moe_overlap}"] if self.moe_overlap != "none" else []
        parts += [f"mb{self.micro_batch}"] + ([f"vpp{self.vpp}"] if self.vpp > 1 else [])
        parts += ["sp"] if self.sequence_parallel else []
        parts += [f"rc-{self.recompute}"] if self.recompute != "none" else []
        parts += [f"rc-{'+'.join(self.recompute_modules)}"] if self.recompute_modules else []
        parts += [ZERO_TAGS[self.zero]] if self.zero else []
        return " ".join(parts)


ZERO_TAGS = {1: "distopt", 2: "zero2", 3: "fsdp"}


def _degree_summary(degrees: tuple[int, ...] | None) -> str:
    """'4-8' for a per-layer layout whose degrees range from 4 to 8."""
    return f"{min(degrees)}-{max(degrees)}" if degrees else ""


def sub_batch(micro_batch: int, t: int, width: int) -> tuple[int, int]:
    """(sequences, sequence split) of one degree-t TP group in a stage of ``width`` GPUs.

    The stage's micro-batch is divided over its width/t groups: each takes micro_batch * t /
    width sequences, or, when that is below one, a 1/split slice of one sequence (context
    parallelism inside the stage).

    >>> sub_batch(4, 2, 8), sub_batch(1, 2, 8), sub_batch(2, 8, 8)
    ((1, 1), (1, 4), (2, 1))
    """
    r = micro_batch * t
    if r % width == 0:
        return r // width, 1
    if width % r == 0:
        return 1, width // r
    raise InputError(
        f"micro_batch({micro_batch}) * t({t}) = {r} and the stage width tp({width}) must divide one another "
        "so the micro-batch splits evenly over the stage's TP groups"
    )


def check_layout(
    layout: ParallelLayout, model: ModelSpec, training: TrainingSpec, num_gpus: int, domain_size: int
) -> None:
    """Raise InputError naming the first rule ``layout`` breaks for this model and cluster."""
    lay, m = layout, model
    if lay.world_size != num_gpus:
        raise InputError(
            f"tp({lay.tp}) * cp({lay.cp}) * dp({lay.dp}) * pp({lay.pp}) = {lay.world_size} != GPUs({num_gpus}); "
            "the degrees must multiply to the GPU count"
        )
    if lay.global_batch != training.global_batch:
        raise InputError(f"layout global_batch({lay.global_batch}) != training global_batch({training.global_batch})")
    if lay.tp > domain_size or domain_size % lay.tp:
        raise InputError(
            f"tp({lay.tp}) must divide the NVLink domain size ({domain_size}) so each TP group stays inside one domain"
        )
    if lay.layer_tp is None:  # per-layer layouts are checked block by block below
        if m.num_heads % lay.tp:
            raise InputError(f"heads({m.num_heads}) % tp({lay.tp}) = {m.num_heads % lay.tp}; tp must divide the heads")
        if m.num_kv_heads % lay.tp and lay.tp % m.num_kv_heads:
            raise InputError(
                f"kv_heads({m.num_kv_heads}) and tp({lay.tp}) must divide one another "
                "(KV groups are split or replicated)"
            )
        if m.ffn_hidden_size % lay.tp:
            raise InputError(f"ffn_hidden_size({m.ffn_hidden_size}) % tp({lay.tp}) != 0; tp must divide the MLP width")
    if lay.pp > m.num_layers:
        raise InputError(f"pp({lay.pp}) > layers({m.num_layers}); each stage needs at least one layer")
    chunks = lay.chunks(m.num_layers)
    if sum(chunks) != m.num_layers:
        raise InputError(f"the pipeline chunks hold {sum(chunks)} layers but the model has {m.num_layers}")
    last = len(chunks) - 1
    empty = [c for c, n in enumerate(chunks) if n == 0 and c not in (0, last)]
    if empty:
        raise InputError(
            f"pp({lay.pp}) * vpp({lay.vpp}) = {len(chunks)} chunks for {m.num_layers} layers leave chunk(s) "
            f"{empty[:5]} empty (only the first and last may hold just the embedding or the loss); lower vpp"
        )
    if lay.vpp > 1 and lay.num_micro_batches % lay.pp:
        raise InputError(
            f"the interleaved schedule needs micro-batches per step ({lay.num_micro_batches}) to be a multiple of "
            f"pp({lay.pp}) (Megatron-Core); change the global batch, micro-batch or dp, or drop vpp"
        )
    if lay.cp > 1 and training.seq_len % (2 * lay.cp):
        raise InputError(
            f"seq_len({training.seq_len}) % (2 * cp({lay.cp})) != 0; causal CP splits the sequence in 2*cp chunks"
        )
    if lay.sequence_parallel and (training.seq_len // lay.cp) % lay.tp:
        raise InputError(
            f"seq_len({training.seq_len}) / cp({lay.cp}) is not divisible by tp({lay.tp}); sequence parallelism "
            "splits each sequence chunk over the TP ranks (choose a multiple, or set sequence_parallel false)"
        )
    width = lay.tp * lay.cp * lay.dp  # the GPUs of one pipeline stage
    if lay.ep > 1:
        if not m.is_moe:
            raise InputError(f"ep({lay.ep}) > 1 needs an MoE model; {m.name} is dense")
        if m.num_experts % lay.ep:
            raise InputError(f"experts({m.num_experts}) % ep({lay.ep}) != 0; ep must divide the experts")
        if width % (lay.expert_tp * lay.ep):
            raise InputError(
                f"etp({lay.expert_tp}) * ep({lay.ep}) = {lay.expert_tp * lay.ep} does not divide the "
                f"tp({lay.tp}) * cp({lay.cp}) * dp({lay.dp}) = {width} GPUs of a pipeline stage; the experts' "
                "grid must tile them (set etp 1 to fold ep over the TP ranks, or change ep)"
            )
    if lay.etp is not None:
        if not m.is_moe:
            raise InputError(f"etp({lay.etp}) needs an MoE model; {m.name} is dense (leave etp unset)")
        if lay.expert_tp > domain_size or domain_size % lay.expert_tp:
            raise InputError(f"etp({lay.expert_tp}) must divide the NVLink domain size ({domain_size})")
        if m.moe_ffn_hidden_size % lay.expert_tp:
            raise InputError(
                f"moe_ffn_hidden_size({m.moe_ffn_hidden_size}) % etp({lay.expert_tp}) != 0; etp must divide the "
                "expert width"
            )
        if width % lay.expert_tp:
            raise InputError(f"etp({lay.expert_tp}) does not divide the {width} GPUs of a pipeline stage")
    if (lay.moe_dispatcher != "alltoall" or lay.moe_overlap != "none") and not m.is_moe:
        raise InputError(f"moe_dispatcher and moe_overlap apply to MoE models; {m.name} is dense")
    if training.moe_capacity_factor is not None and not m.is_moe:
        raise InputError(
            f"moe_capacity_factor({training.moe_capacity_factor:g}) caps the tokens each expert takes; {m.name} is "
            "dense (leave it unset)"
        )
    if training.moe_flex_backend is not None and not m.is_moe:
        raise InputError(
            f"moe_flex_backend({training.moe_flex_backend}) picks how MoE tokens are dispatched; {m.name} is dense "
            "(leave it unset)"
        )
    if "mla_up_proj" in lay.recompute_modules and not m.is_mla:
        raise InputError(f"recompute module 'mla_up_proj' needs multi-latent attention; {m.name} has none")
    if "moe_act" in lay.recompute_modules and not m.is_moe:
        raise InputError(f"recompute module 'moe_act' recomputes the experts' activation; {m.name} is dense")
    if lay.layer_tp is not None:
        _check_layer_tp(lay, m, training, domain_size)
    if training.seq_len > m.max_position_embeddings and m.position == "learned":
        raise InputError(
            f"seq_len({training.seq_len}) > max_position_embeddings({m.max_position_embeddings}) of {m.name}"
        )


def block_degree_ok(model: ModelSpec, block: int, t: int) -> str | None:
    """Why block ``block`` (0 = embedding, L+1 = head) cannot run at degree t, or None."""
    if block == 0 or block == model.num_layers + 1:
        return None  # the vocabulary is padded to a multiple of 128 * t
    kind = model.layer_kind(block - 1)
    if kind.attention and model.num_heads % t:
        return f"heads({model.num_heads}) % t({t}) != 0"
    if kind.attention and model.num_kv_heads % t and t % model.num_kv_heads:
        return f"kv_heads({model.num_kv_heads}) and t({t}) must divide one another"
    width = model.moe_ffn_hidden_size if kind.moe else kind.ffn
    if width and width % t:
        return f"ffn width({width}) % t({t}) != 0"
    return None


def _check_layer_tp(lay: ParallelLayout, m: ModelSpec, training: TrainingSpec, domain_size: int) -> None:
    degrees = lay.layer_tp or ()
    if len(degrees) != m.num_layers + 2:
        raise InputError(
            f"layer_tp has {len(degrees)} entries but needs {m.num_layers + 2}: "
            f"embedding, {m.num_layers} layers, LM head"
        )
    for block, t in enumerate(degrees):
        if t < 1 or lay.tp % t:
            raise InputError(f"block {block} has degree {t}, which does not divide the stage width tp({lay.tp})")
        why = block_degree_ok(m, block, t)
        if why:
            raise InputError(f"block {block} (layer {block - 1}) cannot run at degree {t}: {why}")
        _, split = sub_batch(lay.micro_batch, t, lay.tp)
        if split > 1 and training.seq_len % (2 * split * lay.cp):
            raise InputError(f"seq_len({training.seq_len}) cannot be split {split * lay.cp} ways for block {block}")
