"""What the executor runs: replicas of pipeline stages, each stage a set of process ranks and a
list of blocks (embedding, layers, LM head) with their TP degrees. Pure data and rank
arithmetic; no torch.

A block at degree ``t`` in a stage of ``w`` ranks runs ``w / t`` copies: local rank ``i`` is TP
rank ``i % t`` of copy ``i // t``, and each copy takes ``micro_batch * t / w`` sequences of every
micro-batch (in-stage data parallelism). Worked example, a stage on ranks (4, 5, 6, 7) holding
a layer at degree 2:

>>> s = StageSpec(ranks=(4, 5, 6, 7), blocks=(Block("layer", 0, 2),))
>>> s.copy_tp_groups(2), s.copy_dp_groups(2)
(((4, 5), (6, 7)), ((4, 6), (5, 7)))

The groups across stages and replicas (data-parallel, expert, all of them in creation order) are
in ``ntp_planner.executor.groups``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cost_models.rank_grid import RankGrid
from ntp_planner.executor.parallel.ownership import contiguous
from ntp_planner.executor.spec_checks import check


@dataclass(frozen=True)
class TinyConfig:
    """Shape of the executor's decoder (a plan's model shrunk, or a test model)."""

    vocab: int = 64  # vocabulary rows (embedding and LM head)
    hidden: int = 32  # model width = heads * head_dim
    layers: int = 2  # transformer layers
    heads: int = 8  # query heads
    kv_heads: int = 2  # key/value heads (grouped-query attention)
    ffn: int = 48  # SwiGLU hidden width
    rope_theta: float = 10000.0  # rotary base
    norm: Literal["rms", "layer"] = "rms"  # RMSNorm (Llama), or LayerNorm with a bias (GPT, Nemotron)
    mlp: Literal["swiglu", "gelu", "relu2"] = "swiglu"  # SwiGLU (3 matrices), or 2 with GELU / squared ReLU
    bias: bool = False  # biases on the linear layers (Megatron's add_bias_linear)
    positions: Literal["rope", "learned"] = "rope"  # rotary, or learned absolute position embeddings
    max_positions: int = 64  # rows of the learned position table (the longest sequence it takes)
    experts: int = 0  # routed experts per MoE layer; 0 = dense model (``moe``)
    top_k: int = 0  # experts each token is routed to
    expert_ffn: int = 0  # SwiGLU hidden width of one expert
    moe_layers: tuple[int, ...] = ()  # indices of the layers whose MLP is a mixture of experts
    shared_ffn: int = 0  # SwiGLU width of the shared expert every token also visits; 0 = none
    aux_coeff: float = 0.01  # weight of the sequence-wise load-balancing loss (``moe.sequence_aux``)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def family(self) -> str:
        """The ModelSpec family whose blocks these are (by the MLP: Llama's SwiGLU, GPT's GELU,
        Nemotron's squared ReLU)."""
        return {"swiglu": "llama", "gelu": "gpt", "relu2": "nemotron"}[self.mlp]

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers


@dataclass(frozen=True)
class Block:
    kind: Literal["embed", "layer", "head"]
    layer: int  # model layer index (kind "layer"); -1 otherwise
    degree: int  # TP degree

    @property
    def name(self) -> str:
        return f"layers.{self.layer}" if self.kind == "layer" else self.kind


@dataclass(frozen=True)
class StageSpec:
    ranks: tuple[int, ...]  # process ranks in local (TP) order
    blocks: tuple[Block, ...]  # every block the stage holds, its virtual chunks one after the other
    chunk_sizes: tuple[int, ...] = ()  # blocks in each virtual chunk (interleaving); () = one chunk

    @property
    def width(self) -> int:
        return len(self.ranks)

    @property
    def chunks(self) -> tuple[tuple[Block, ...], ...]:
        """The blocks of each virtual chunk, in the order the stage holds them.

        >>> StageSpec((0,), (Block("embed", -1, 1), Block("layer", 0, 1), Block("layer", 3, 1)), (2, 1)).chunks[1]
        (Block(kind='layer', layer=3, degree=1),)
        """
        sizes = self.chunk_sizes or (len(self.blocks),)
        starts = [sum(sizes[:v]) for v in range(len(sizes))]
        return tuple(self.blocks[a : a + n] for a, n in zip(starts, sizes, strict=True))

    def copy_tp_groups(self, degree: int) -> tuple[tuple[int, ...], ...]:
        """TP group of every copy of a block at ``degree``: the stage's local ranks as a
        ``RankGrid(tp=degree, dp=width // degree)``, its TP groups."""
        return self._local_groups(degree, "tp")

    def copy_dp_groups(self, degree: int) -> tuple[tuple[int, ...], ...]:
        """Ranks holding the same slice in every copy (in-stage data parallelism): the same grid's
        DP groups."""
        return self._local_groups(degree, "dp")

    def _local_groups(self, degree: int, axis: Literal["tp", "dp"]) -> tuple[tuple[int, ...], ...]:
        grid = RankGrid(tp=degree, dp=self.width // degree)
        return tuple(tuple(self.ranks[i] for i in group) for group in grid.groups(axis))

    def position(self, rank: int, degree: int) -> tuple[int, int]:
        """(copy, TP rank) of process ``rank`` for a block at ``degree``."""
        return divmod(self.ranks.index(rank), degree)


@dataclass(frozen=True)
class ReplicaSpec:
    """One pipeline: a data-parallel replica, or under context parallelism one of its ``cp``
    slices (each holds a chunk of every sequence; slices of a replica are consecutive)."""

    stages: tuple[StageSpec, ...]
    micro_batches: int  # per step; the replica's local batch is micro_batches * micro_batch
    cp_rank: int = 0  # which chunk of the sequence this pipeline holds

    @property
    def model_chunks(self) -> list[tuple[Block, ...]]:
        """The chunks in model order: chunk c is virtual chunk c // pp of stage c % pp
        (Megatron-Core's placement, as ``ntp_planner.plan.chunk_placements``); with one chunk per
        stage, the stages in order.

        >>> st = lambda *layers: StageSpec((0,), tuple(Block("layer", i, 1) for i in layers), (1, 1))
        >>> [[b.layer for b in c] for c in ReplicaSpec((st(0, 2), st(1, 3)), 2).model_chunks]
        [[0], [1], [2], [3]]
        """
        vpp = len(self.stages[0].chunks)
        return [st.chunks[v] for v in range(vpp) for st in self.stages]


@dataclass(frozen=True)
class StageExperts:
    """Who holds which routed experts on one pipeline stage, whole (expert tensor parallelism 1):
    the re-planner's re-hosting after a failure (``ReplanResult``'s expert hosting), or any
    placement. Each EP group holds every expert once; a rank's tokens go to its group's owners."""

    groups: tuple[tuple[int, ...], ...]  # EP groups: the stage's ranks (every pipeline's) split into disjoint sets
    owners: tuple[tuple[int, ...], ...]  # per expert id, the ranks holding it, one per group (its edp group)


@dataclass(frozen=True)
class RunSpec:
    """A whole run: the model, the replicas and the training loop."""

    cfg: TinyConfig
    replicas: tuple[ReplicaSpec, ...]
    micro_batch: int
    seq_len: int
    cp: int = 1  # context-parallel degree: pipelines per data replica
    steps: int = 3
    lr: float = 1e-4  # fp32 rounding of tiny gradients, amplified by Adam, grows with lr (1e-5 at 1e-3)
    seed: int = 0
    recompute: Literal["none", "selective", "full"] = "none"  # activations recomputed in backward: none, the
    # core attention softmax(QK^T)V (Megatron's selective) or whole layers (torch.utils.checkpoint)
    sequence_parallel: bool = False  # reduce-scatter / all-gather on stages whose blocks all run at full width
    weighted: bool = True  # False: plain mean of replica gradients (wrong when batches differ)
    dtype: str = "float32"  # torch dtype name of parameters and activations
    notes: tuple[str, ...] = field(default=())  # how the run differs from the plan it stands for
    vpp: int = 1  # virtual chunks per stage: > 1 runs Megatron's interleaved 1F1B (``interleave``)
    ep: int = 1  # expert-parallel degree: consecutive pipelines (cp fastest, as Megatron) split the experts
    zero: int = 0  # ZeRO level over each parameter's data-parallel group (``zero``): 0 replicated, 1 optimizer
    # state sharded (Megatron's distributed optimizer), 2 also gradients, 3 also parameters (FSDP)
    reshard_after_forward: bool = True  # ZeRO-3: free gathered parameters after forward, gather again for backward
    etp: int | None = None  # expert tensor parallelism (parallel folding): None = each MoE layer's TP degree, the
    # experts split over pipelines; else the experts' grid etp x ep x edp over each stage's ranks (``groups``)
    hosting: tuple[StageExperts, ...] = ()  # per stage, explicit owners of whole experts (overrides ep / etp)

    def __post_init__(self):
        check(self)  # spec_checks: the run is one the executor can run exactly

    @property
    def world_size(self) -> int:
        return sum(s.width for r in self.replicas for s in r.stages)

    @property
    def pp(self) -> int:
        return len(self.replicas[0].stages)

    @property
    def total_sequences(self) -> int:
        return sum(r.micro_batches for r in self.replicas if r.cp_rank == 0) * self.micro_batch

    @property
    def data_replicas(self) -> int:
        return len(self.replicas) // self.cp

    def seq_chunk(self, replica: int) -> tuple[int, int]:
        """[start, end) of the sequence positions pipeline ``replica`` holds."""
        return contiguous(self.seq_len, self.cp)[self.replicas[replica].cp_rank]

    @property
    def pipeline_grid(self) -> RankGrid:
        """The pipelines (``replicas``) as ranks of a ``RankGrid(cp, dp)``: pipeline ``q`` is cp
        slice ``q % cp`` of data replica ``q // cp``, the project's rank order with tp = pp = 1.
        The cp, EP and expert data-parallel groups are its groups (``executor.groups``)."""
        return RankGrid(cp=self.cp, dp=self.data_replicas)

    def cp_group(self, replica: int, stage: int, local: int) -> tuple[int, ...]:
        """Ranks at local position ``local`` of ``stage`` in every cp slice of the replica (the
        pipelines of its cp group in ``pipeline_grid``)."""
        pipelines = self.pipeline_grid.group("cp", replica)
        return tuple(self.replicas[q].stages[stage].ranks[local] for q in pipelines)

    def locate(self, rank: int) -> tuple[int, int]:
        """(replica, stage) of process ``rank``."""
        for i, rep in enumerate(self.replicas):
            for s, st in enumerate(rep.stages):
                if rank in st.ranks:
                    return i, s
        raise ValueError(f"rank {rank} is in no stage")

    def first_sequence(self, replica: int) -> int:
        """Index of the replica's first sequence in the step's batch (replicas in order; the cp
        slices of a replica share its sequences)."""
        first = replica - self.replicas[replica].cp_rank
        return sum(r.micro_batches for r in self.replicas[:first] if r.cp_rank == 0) * self.micro_batch


def make_spec(
    cfg: TinyConfig,
    stage_degrees: list[list[int]],
    replicas: list[tuple[list[int], int]],
    micro_batch: int,
    seq_len: int,
    width: int | None = None,
    cp: int = 1,
    vpp: int = 1,
    **run,
) -> RunSpec:
    """A RunSpec from the blocks' degrees per stage (``stage_degrees[s]``: embedding first on
    stage 0, LM head last on the last stage, degrees relative to the healthy stage ``width``,
    by default the largest degree) and per replica (its stage widths, its micro-batches). A stage narrower
    than the healthy width (NTP) runs every block at its width. Each replica runs ``cp``
    pipelines, one per chunk of the sequence. Process ranks follow the project's rank order
    (``RankGrid``) restricted to live ranks: the TP groups are taken in rank order (stage-major,
    then replica, then cp rank), each numbering as many ranks as its width.

    >>> s = make_spec(TinyConfig(layers=2), [[2, 2], [2, 2]], [([2, 2], 1), ([2, 1], 1)], 1, 4)
    >>> [[st.ranks for st in r.stages] for r in s.replicas]
    [[(0, 1), (4, 5)], [(2, 3), (6,)]]

    With ``vpp`` > 1, ``stage_degrees`` lists the degrees of every model chunk in model order
    (pp * vpp entries, chunk c on stage c % pp as its virtual chunk c // pp):

    >>> s = make_spec(TinyConfig(layers=5), [[1, 1, 1], [1], [1], [1, 1]], [([1, 1], 2)], 1, 4, vpp=2)
    >>> [[b.name for b in st.blocks] for st in s.replicas[0].stages], s.replicas[0].stages[0].chunk_sizes
    ([['embed', 'layers.0', 'layers.1', 'layers.3'], ['layers.2', 'layers.4', 'head']], (3, 1))
    """
    chunk_degrees = stage_degrees
    if len(chunk_degrees) % vpp:
        raise ValueError(f"{len(chunk_degrees)} chunks of degrees do not split into pp stages of vpp({vpp}) chunks")
    pp = len(chunk_degrees) // vpp
    healthy = width or max(max(d) for d in chunk_degrees)
    chunk_blocks = _chunk_blocks([len(d) for d in chunk_degrees])
    ranks = _stage_ranks(replicas, cp, pp)
    reps = []
    for r, (widths, micro) in enumerate(replicas):
        for c in range(cp):
            stages = []
            for s in range(pp):
                held = []
                mine = range(s, pp * vpp, pp)  # this stage's chunks, virtual chunk 0 first
                for k in mine:
                    degs = chunk_degrees[k] if widths[s] == healthy else [widths[s]] * len(chunk_degrees[k])
                    held += [Block(kind, i, t) for (kind, i), t in zip(chunk_blocks[k], degs, strict=True)]
                sizes = tuple(len(chunk_blocks[k]) for k in mine) if vpp > 1 else ()
                stages.append(StageSpec(ranks[r, c, s], tuple(held), sizes))
            reps.append(ReplicaSpec(tuple(stages), micro, c))
    return RunSpec(cfg, tuple(reps), micro_batch, seq_len, cp, vpp=vpp, **run)


def _chunk_blocks(lengths: list[int]) -> list[list[tuple[str, int]]]:
    """(kind, layer) of every block of each model chunk: the embedding opens the first chunk,
    the LM head closes the last, layers are numbered across chunks in model order.

    >>> _chunk_blocks([2, 1, 2])
    [[('embed', -1), ('layer', 0)], [('layer', 1)], [('layer', 2), ('head', -1)]]
    """
    layer, out = 0, []
    for c, n in enumerate(lengths):
        kinds = ["layer"] * n
        if c == 0:
            kinds[0] = "embed"
        if c == len(lengths) - 1:
            kinds[-1] = "head"
        blocks = []
        for kind in kinds:
            blocks.append((kind, layer if kind == "layer" else -1))
            layer += kind == "layer"
        out.append(blocks)
    return out


def _stage_ranks(
    replicas: list[tuple[list[int], int]], cp: int, pp: int
) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """Process ranks of every (replica, cp rank, stage): the TP groups in the project's rank
    order (``RankGrid`` over one slot per TP group: cp, then replica, then stage), each numbering
    as many ranks as its width (an NTP stage fewer)."""
    next_rank, ranks = 0, {}
    stage_slots = RankGrid(cp=cp, dp=len(replicas), pp=pp)  # one rank per TP group
    for slot in range(stage_slots.world_size):
        _, c, r, s = stage_slots.coords(slot)
        width = replicas[r][0][s]
        ranks[r, c, s] = tuple(range(next_rank, next_rank + width))
        next_rank += width
    return ranks
