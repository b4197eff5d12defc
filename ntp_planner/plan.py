"""Plan: the one artifact. Inputs (model, training, cluster), the chosen layout, where each rank
runs, the predicted cost, and the runner-up layouts. Emitters, the executor and the simulator
read only this file, and beside it the re-plan a failure leaves (``ntp_planner.replan_result``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from cost_models.efficiency import Efficiency
from cost_models.layout import ParallelLayout, check_layout
from cost_models.model import ModelSpec
from cost_models.step import StepCost
from cost_models.training import TrainingSpec
from ntp_planner.outputs import write_atomic  # Plan.save, and callers that import it from here
from topologies.bounds import show
from topologies.cluster import MAX_GPUS, Cluster
from topologies.cluster_catalogue import ClusterSpec, first_error
from topologies.errors import InputError
from topologies.files import read_mapping

SCHEMA_VERSION = 2  # 2: ZeRO levels, model chunks, number formats (a version-1 plan must be re-made)
MAX_PLAN_BYTES = 256 * 2**20  # a plan of MAX_GPUS GPUs: its placement is about 8 MB, its pipeline a few MB
RE_PLAN = "re-plan it instead of editing it"
RE_PREDICT = "re-run `ntp plan ... -o` or `ntp estimate ... -o` on the inputs you want"
Objective = Literal["step-time", "goodput"]
GoodputStrategy = Literal["restart", "dp-drop", "spares", "ntp", "ntp-pw"]


class EditedPlan(InputError):
    """A plan whose inputs (model, training, cluster, layout) no longer match its inputs_hash."""


def _version_message(version) -> str:
    return f"this plan has schema version {version!r}; this ntp reads version {SCHEMA_VERSION}: re-plan it"


class ClusterInputs(BaseModel):
    """The cluster as the plan saw it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: ClusterSpec
    num_gpus: int
    gpus_per_domain: int | None = Field(
        default=None, description="GPUs used in each NVLink domain; None (and plans older than it) = all."
    )
    failed_gpus: list[int] = Field(default_factory=list, max_length=MAX_GPUS)

    @model_validator(mode="after")
    def _is_a_cluster(self) -> ClusterInputs:
        try:
            self.build()  # Cluster checks the GPU count, the domain use and the failed ids
        except ValidationError as exc:
            raise InputError(first_error(exc)) from None
        return self

    def build(self) -> Cluster:
        return Cluster(
            spec=self.spec,
            num_gpus=self.num_gpus,
            gpus_per_domain=self.gpus_per_domain,
            failed_gpus=frozenset(self.failed_gpus),
        )


class RunnerUp(BaseModel):
    """A layout that lost, with the numbers it lost on."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    layout: ParallelLayout
    step_time_s: float
    mfu: float
    tokens_per_s: float
    memory_per_gpu_bytes: float
    time_breakdown_s: dict[str, float]

    @field_validator("step_time_s", "tokens_per_s", "memory_per_gpu_bytes")
    @classmethod
    def _positive(cls, value: float) -> float:
        return _positive(value)

    @field_validator("mfu")
    @classmethod
    def _fraction(cls, value: float) -> float:
        return _mfu(value)


class GoodputEntry(BaseModel):
    """A candidate layout ranked by throughput under failures."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    layout: ParallelLayout
    tokens_per_s: float = Field(gt=0, description="Failure-free throughput.")
    capacity_goodput: float = Field(ge=0, le=1, description="Expected useful share under failures (short simulation).")
    effective_tokens_per_s: float = Field(ge=0, description="tokens_per_s x capacity_goodput.")


def _positive(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{show(value)} must be a finite number above 0; {RE_PLAN}")
    return value


def _mfu(value: float) -> float:
    """MFU is a share of the GPUs' peak: above 0 and at most 1."""
    if not (math.isfinite(value) and 0 < value <= 1):
        raise InputError(f"{show(value)} must be a fraction in (0, 1]; {RE_PLAN}")
    return value


class ChunkPlacement(BaseModel):
    """One model chunk of the pipeline: where it runs and which blocks it holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chunk: int = Field(description="Index in model order (0 holds the embedding, the last the LM head and loss).")
    stage: int = Field(description="Pipeline stage that runs it: chunk % pp.")
    virtual_chunk: int = Field(description="Which of the stage's interleaved chunks it is: chunk // pp.")
    layers: list[int] = Field(description="Transformer layers it holds (0-based), in order.")
    embedding: bool = Field(description="It holds the embedding.")
    loss: bool = Field(description="It holds the LM head and the loss.")
    tp: list[int] = Field(description="TP degree of each block it holds: [embedding], layers, [LM head].")


def chunk_placements(layout: ParallelLayout, num_layers: int) -> list[ChunkPlacement]:
    """Where every layer lives: the layout's chunks in model order, each on stage c % pp as its
    virtual chunk c // pp, with the TP degree of every block.

    >>> [(c.stage, c.virtual_chunk, c.layers) for c in chunk_placements(ParallelLayout(pp=2, vpp=2, global_batch=8), 6)]
    [(0, 0, [0, 1]), (1, 0, [2, 3]), (0, 1, [4]), (1, 1, [5])]
    """
    degrees = layout.block_tp(num_layers)
    last = layout.pp * layout.vpp - 1
    out = []
    for stage in range(layout.pp):
        for chunk, start, count in layout.stage_chunks(stage, num_layers):
            blocks = ([0] if chunk == 0 else []) + list(range(start + 1, start + count + 1))
            blocks += [num_layers + 1] if chunk == last else []
            out.append(
                ChunkPlacement(
                    chunk=chunk,
                    stage=stage,
                    virtual_chunk=chunk // layout.pp,
                    layers=list(range(start, start + count)),
                    embedding=chunk == 0,
                    loss=chunk == last,
                    tp=[degrees[b] for b in blocks],
                )
            )
    return sorted(out, key=lambda c: c.chunk)


SHOWN_COUNTS = ("params_total", "params_active")  # shown beside a plan in --json, derived from its model


def take_shown_counts(data: dict) -> dict:
    """Pop the parameter counts ``--json`` prints beside a plan or re-plan (``views.model.params_json``),
    so that output loads back as the file it shows; ``check_shown_counts`` checks them after."""
    return {key: data.pop(key) for key in SHOWN_COUNTS if key in data}


def check_shown_counts(shown: dict, model: ModelSpec, path: Path, fix: str) -> None:
    """Refuse counts that disagree with the model they were shown beside: an edited file."""
    for key, value in shown.items():
        if value != getattr(model, key):
            raise InputError(f"{path} gives {key} {value!r} but its model has {getattr(model, key)}: {fix}.")


class Plan(BaseModel):
    """A layout for one model on one cluster, with its predicted cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Bumped on incompatible changes.")
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterInputs
    inputs_hash: str = Field(
        description="sha256 of the canonical JSON of model, training, cluster and layout: what ``predicted`` was "
        "computed from. Checked on load, so an edited input is refused instead of explained under an old prediction."
    )
    headroom: float = Field(description="Fraction of HBM kept free when the plan was made.")
    layout: ParallelLayout
    placement: list[int] = Field(description="GPU id of each rank, in the project's rank order.")
    per_layer_tp: list[int] = Field(description="TP degree of every block: embedding, each layer, LM head.")
    pipeline: list[ChunkPlacement] = Field(
        default_factory=list,
        description="Which layers every model chunk holds and on which stage and virtual chunk it runs, with "
        "their TP degrees: the one description of where layers live that the cost model, the exporters and "
        "the executor share (filled from the layout when absent).",
    )
    predicted: StepCost
    runners_up: list[RunnerUp] = Field(default_factory=list)
    megatron: RunnerUp | None = Field(
        default=None, description="Best layout Megatron-LM can run (one TP degree for all layers), when it differs."
    )
    source: Literal["search", "user"] = Field(description="'search' (ntp plan) or 'user' (ntp estimate -o).")
    objective: Objective = Field(default="step-time", description="What the search maximised: step-time or goodput.")
    goodput_strategy: GoodputStrategy | None = Field(
        default=None, description="Failure strategy the goodput ranking assumed."
    )
    goodput_ranking: list[GoodputEntry] = Field(
        default_factory=list, description="Candidates by effective tokens/s under failures (objective goodput)."
    )
    search_notes: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Candidates the inputs ruled out or changed, and why (an odd sequence length, say).",
    )
    runtime: Literal["megatron", "executor", "torchtitan"] = Field(
        default="megatron",
        description="The runtime ``predicted`` was costed for (Efficiency.runtime; `--runtime`). Left out of "
        "dumps and of inputs_hash while 'megatron', so plans written before it stay byte for byte and keep their "
        "hash; any other runtime is hashed, so an edited runtime is refused like any edited input.",
    )

    @property
    def default_efficiency(self) -> Efficiency:
        """The cost model's constants (no profile) for the runtime this plan was costed for: what
        every re-costing of the plan (re-plans, per-layer views) starts from."""
        from cost_models.efficiency import DEFAULT_EFFICIENCY

        return DEFAULT_EFFICIENCY.with_profile(None, self.runtime)

    @model_serializer(mode="wrap")
    def _omit_default_runtime(self, handler):
        data = handler(self)
        if self.runtime == "megatron" and isinstance(data, dict):
            data.pop("runtime", None)
        return data

    @field_validator("schema_version", mode="before")
    @classmethod
    def _known_version(cls, value):
        if type(value) is not int or value != SCHEMA_VERSION:
            raise InputError(_version_message(value))
        return value

    @field_validator("headroom")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0 <= value < 1:
            raise InputError(f"{show(value)} must lie in [0, 1): it is the fraction of HBM kept free")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        """The parts of a plan agree: a hand-edited or truncated plan fails here, on load."""
        self._check_layout()
        self._check_placement()
        expected = chunk_placements(self.layout, self.model.num_layers)
        if not self.pipeline:
            object.__setattr__(self, "pipeline", expected)
        elif self.pipeline != expected:
            raise InputError(f"pipeline does not match the layout's chunks and degrees; {RE_PLAN}")
        self._check_hash()
        self._check_predicted()
        return self

    def _check_hash(self) -> None:
        """The prediction belongs to these inputs: an edited model, training, cluster or layout
        changes the hash, and the format must be one the cluster's GPU runs."""
        self.cluster.build().gpu.peak_flops_per_s(self.training.dtype)  # fp8 on an A100: one sentence
        if inputs_hash(self.model, self.training, self.cluster, self.layout, self.runtime) != self.inputs_hash:
            if inputs_hash(self.model, self.training, self.cluster, None) == self.inputs_hash:
                raise EditedPlan(
                    f"was made before inputs_hash covered the layout, so an edit of its layout cannot be told: "
                    f"{RE_PREDICT}"
                )
            raise EditedPlan(
                f"was edited after it was predicted (its model, training, cluster, layout or runtime no longer give "
                f"its inputs_hash {self.inputs_hash[:12]}...): {RE_PREDICT}"
            )

    def _check_layout(self) -> None:
        lay, gpus, L = self.layout, self.cluster.num_gpus, self.model.num_layers
        if lay.world_size != gpus:
            raise InputError(
                f"layout tp({lay.tp}) * cp({lay.cp}) * dp({lay.dp}) * pp({lay.pp}) = {lay.world_size} != "
                f"cluster.num_gpus({gpus}); the degrees must multiply to the GPU count: {RE_PLAN}"
            )
        try:
            check_layout(lay, self.model, self.training, gpus, self.cluster.build().tp_domain_size)
        except InputError as exc:
            raise InputError(f"the layout does not suit the model and cluster: {exc}") from None
        if len(self.per_layer_tp) != L + 2:
            raise InputError(
                f"per_layer_tp has {len(self.per_layer_tp)} entries but needs {L + 2} (embedding, {L} layers, "
                f"LM head); {RE_PLAN}"
            )
        expected = lay.block_tp(L)
        wrong = [b for b, (t, u) in enumerate(zip(self.per_layer_tp, expected, strict=True)) if t != u]
        if wrong:
            b = wrong[0]
            raise InputError(
                f"per_layer_tp gives block {b} degree {self.per_layer_tp[b]} but the layout runs it at {expected[b]}; "
                f"{RE_PLAN}"
            )

    def _check_placement(self) -> None:
        """Rank r runs on GPU placement[r]: one healthy GPU of the cluster per rank, none twice."""
        ranks, gpus = len(self.placement), self.cluster.num_gpus
        if ranks != self.layout.world_size:
            raise InputError(
                f"placement lists {ranks} GPUs but the layout has {self.layout.world_size} ranks; {RE_PLAN}"
            )
        outside = [g for g in self.placement if not 0 <= g < gpus]
        if outside:
            raise InputError(f"placement names GPU(s) {outside[:5]} outside 0..{gpus - 1}; {RE_PLAN}")
        twice = sorted(g for g, n in Counter(self.placement).items() if n > 1)
        if twice:
            raise InputError(f"placement puts two ranks on GPU(s) {twice[:5]}; {RE_PLAN}")
        failed = sorted(set(self.placement) & set(self.cluster.failed_gpus))
        if failed:
            raise InputError(f"placement puts ranks on failed GPU(s) {failed[:5]}; {RE_PLAN}")

    def _check_predicted(self) -> None:
        """Every predicted number is one a step can have: times and sizes finite and above 0 (a
        breakdown part may be 0), MFU a fraction in (0, 1], one entry per pipeline stage."""
        p, pp = self.predicted, self.layout.pp
        positive = {"step_time_s": p.step_time_s, "memory_per_gpu_bytes": p.memory_per_gpu_bytes}
        positive |= {"tokens_per_s": p.tokens_per_s, "hbm_bytes": p.hbm_bytes, "tflops_per_gpu": p.tflops_per_gpu}
        positive |= {"model_flops_per_step": p.model_flops_per_step}
        positive |= {f"stage_time_s[{i}]": v for i, v in enumerate(p.stage_time_s)}
        positive |= {f"stage_memory_bytes[{i}]": v for i, v in enumerate(p.stage_memory_bytes)}
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"predicted.{name} is {show(value)}; it must be a finite number above 0: {RE_PLAN}")
        parts = {f"time_breakdown_s.{k}": v for k, v in p.time_breakdown_s.items()}
        parts |= {f"memory_breakdown_bytes.{k}": v for k, v in p.memory_breakdown_bytes.items()}
        for name, value in parts.items():
            if not (math.isfinite(value) and value >= 0):
                raise InputError(
                    f"predicted.{name} is {show(value)}; it must be a finite number of 0 or more: {RE_PLAN}"
                )
        for name in ("mfu", "mfu_causal"):
            value = getattr(p, name)
            if not (math.isfinite(value) and 0 < value <= 1):
                raise InputError(f"predicted.{name} is {show(value)}; it must be a fraction in (0, 1]: {RE_PLAN}")
        for name in ("stage_time_s", "stage_memory_bytes"):
            if len(getattr(p, name)) != pp:
                raise InputError(
                    f"predicted.{name} has {len(getattr(p, name))} entries but the layout has pp {pp} stages: {RE_PLAN}"
                )
        self._check_predicted_agrees()
        if not 0 <= p.bottleneck_stage < pp:
            raise InputError(
                f"predicted.bottleneck_stage is {show(p.bottleneck_stage)}; it must be a stage, 0..{pp - 1}: {RE_PLAN}"
            )

    def _check_predicted_agrees(self) -> None:
        """The predicted numbers agree with one another and with the inputs, as the step
        estimator computes them (``cost_models.step``): the time parts sum to the step time,
        the memory parts to the fullest GPU's bytes, which is the fullest stage's; HBM is the
        GPU's; tokens/s is the batch's tokens over the step time. A number edited alone fails."""
        p, t = self.predicted, self.training
        agree = (
            ("the sum of time_breakdown_s", sum(p.time_breakdown_s.values()), "step_time_s", p.step_time_s),
            (
                "the sum of memory_breakdown_bytes",
                sum(p.memory_breakdown_bytes.values()),
                "memory_per_gpu_bytes",
                p.memory_per_gpu_bytes,
            ),
            (
                "the largest stage_memory_bytes",
                max(p.stage_memory_bytes, default=0.0),
                "memory_per_gpu_bytes",
                p.memory_per_gpu_bytes,
            ),
            ("hbm_bytes", p.hbm_bytes, "the GPU's HBM", self.cluster.build().gpu.hbm_bytes),
            (
                "tokens_per_s x step_time_s",
                p.tokens_per_s * p.step_time_s,
                f"seq_len({t.seq_len}) x global_batch({t.global_batch})",
                float(t.seq_len * t.global_batch),
            ),
        )
        for name, value, other, expected in agree:
            if not math.isclose(value, expected, rel_tol=1e-6):
                raise InputError(
                    f"predicted: {name} is {show(value)} but {other} is {show(expected)}; they must agree: {RE_PLAN}"
                )

    @property
    def megatron_gap(self) -> float:
        """Throughput of this plan over the Megatron-expressible one, minus 1 (0 if the same)."""
        if self.megatron is None:
            return 0.0
        return self.megatron.step_time_s / self.predicted.step_time_s - 1

    def save(self, path: Path) -> None:
        """Write atomically: a temp file in the same folder, then rename over ``path``."""
        write_atomic(path, self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: Path) -> Plan:
        """Read and check a plan file: any inconsistency fails here, in one sentence naming the file."""
        data = read_mapping(path, "plan", max_bytes=MAX_PLAN_BYTES, kind="JSON")
        if "schema_version" not in data:
            raise InputError(f"{path} is not a plan file (no schema_version); give a file a Plan was saved to.")
        version = data["schema_version"]
        if type(version) is not int or version != SCHEMA_VERSION:
            raise InputError(f"plan {path}: {_version_message(version)}.")
        shown = take_shown_counts(data)
        try:
            plan = cls.model_validate(data)
        except ValidationError as exc:
            cause = exc.errors()[0].get("ctx", {}).get("error")
            if isinstance(cause, EditedPlan):
                raise InputError(f"{path} {cause}.") from None
            raise InputError(f"plan {path} is malformed: {first_error(exc)}.") from None
        check_shown_counts(shown, plan.model, path, RE_PREDICT)
        return plan


def _unset_later_fields(cluster: ClusterInputs) -> dict:
    """Fields added after the first plans were hashed, while they hold their defaults."""
    out: dict = {}
    if cluster.gpus_per_domain is None:
        out["gpus_per_domain"] = True
    if cluster.spec.custom_gpu is None:
        out["spec"] = {"custom_gpu"}
    return out


LATER_FIELDS: dict[str, frozenset[str]] = {
    "ModelSpec": frozenset(
        {
            "q_lora_rank",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "v_head_dim",
            "mtp_layers",
            "sliding_window",
            "full_attention_every",
            "attention_sinks",
            "rope_theta",
            "rope_scaling_factor",
            "yarn",
            "norm_eps",
            "qkv_bias",
            "moe_aux_loss_coeff",
            "moe_router_score_function",
            "moe_router_expert_bias",
            "gate_activation",
            "gate_linear_offset",
            "activation_clamp",
            "mlp_activation",
            "qk_norm",
            "post_norms",
            "attention_softcap",
            "final_softcap",
            "qk_norm_span",
            "qk_l2_norm",
            "norm_zero_centered",
            "rotary_fraction",
            "nope_every",
        }
    ),
    "ParallelLayout": frozenset({"etp", "moe_dispatcher", "moe_overlap", "recompute_modules"}),
    "TrainingSpec": frozenset(
        {
            "moe_capacity_factor",
            "moe_pad_to_capacity",
            "moe_flex_backend",
            "cuda_graphs",
            "fp8_attention",
            "rope_fusion",
        }
    ),
}
"""Fields added to the inputs after plans were first saved (issue 24's MoE fields, issue 25's model
fields the exports carry and their follow-up's query/key norm, norm offset and rotary share): the hash leaves
each out while it holds its default, so older plans and the hashes their exports carry stand.
A field added to ModelSpec, TrainingSpec or ParallelLayout later belongs here."""


def _dump_without_later_defaults(spec: ModelSpec | TrainingSpec | ParallelLayout) -> dict:
    later = LATER_FIELDS[type(spec).__name__]
    fields = type(spec).model_fields
    skip = {k for k in later if getattr(spec, k) == fields[k].default}
    return spec.model_dump(mode="json", exclude=skip)


def inputs_hash(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterInputs,
    layout: ParallelLayout | None,
    runtime: str = "megatron",
) -> str:
    """sha256 of what a prediction is computed from: the three inputs, the layout and the runtime
    that ran the cost model. A field added later is left out while it holds its default (the
    runtime while 'megatron'), so older plans keep their hash. ``layout=None`` gives the hash of
    plans made before it covered the layout (to tell them from edited ones)."""
    parts = {
        "model": _dump_without_later_defaults(model),
        "training": _dump_without_later_defaults(training),
        "cluster": cluster.model_dump(mode="json", exclude=_unset_later_fields(cluster)),
    }
    if layout is not None:
        parts["layout"] = _dump_without_later_defaults(layout)
    if runtime != "megatron":
        parts["runtime"] = runtime
    blob = json.dumps(
        parts,
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()
