"""ReplanResult: the artifact a re-plan leaves beside its ``Plan`` (``ntp replan -o R.json``).

What every data-parallel replica does after GPU failures and the GPU of every rank, for one plan
(the one whose ``inputs_hash`` it carries). The re-planner (``ntp_planner.failures.replan``) makes
it; the Megatron export, the executor's shrink and validate read it, and ``check_against``
refuses one made for another plan or edited into something no re-plan makes. The policies and
spares behind its fields are described in ``ntp_planner.failures.replan``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cost_models.degraded import MAX_POWER
from ntp_planner.plan import MAX_PLAN_BYTES, Plan, check_shown_counts, take_shown_counts
from topologies.bounds import show
from topologies.cluster_catalogue import first_error
from topologies.errors import InputError
from topologies.files import read_mapping

Policy = Literal["dp-drop", "ntp", "ntp-pw", "spares"]
POLICIES: tuple[str, ...] = ("dp-drop", "ntp", "ntp-pw", "spares")
Fallback = Literal["dp-drop", "ntp", "ntp-pw"]
Count = Annotated[int, Field(ge=0)]
FIX = "re-plan this plan with `ntp replan PLAN -o R.json` instead of editing the re-plan"
BatchMode = Literal["flexible", "fixed"]
BATCH_MODES: tuple[str, ...] = get_args(BatchMode)


class ReplicaState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    replica: int = Field(ge=0, description="Index of the replica in the plan (0..dp - 1).")
    status: Literal["healthy", "degraded", "dropped"]
    stage_tp: list[Annotated[int, Field(ge=0)]] = Field(description="TP degree each pipeline stage runs at.")
    local_batch: int = Field(
        ge=0,
        description="Sequences this replica processes per step (a degraded replica re-cuts its micro-batches: "
        "the last may be smaller than the plan's).",
    )
    power: list[Annotated[float, Field(ge=0, le=MAX_POWER)]] = Field(
        description="Power multiplier of each stage's GPUs (0 for a dropped replica, at most MAX_POWER)."
    )
    gpus_used: int = Field(ge=0)
    gpus_idle: int = Field(ge=0, description="Healthy GPUs of this replica's groups left idle.")
    reason: str | None = Field(
        default=None,
        max_length=10_000,
        description="Why a degraded replica runs as it does, or why a dropped one is dropped.",
    )

    @model_validator(mode="after")
    def _runs_something(self) -> ReplicaState:
        """A replica that runs holds at least one GPU per stage and one sequence; a dropped one
        holds none; a healthy one runs at nominal power."""
        if self.status != "dropped" and (0 in self.stage_tp or self.local_batch < 1):
            raise InputError(
                f"replica {self.replica} is {self.status} but runs stage_tp {self.stage_tp} with local_batch "
                f"{self.local_batch}; a replica that runs needs every stage at TP 1 or more and a batch of 1 or more"
            )
        if self.status == "dropped" and (any(self.stage_tp) or self.local_batch or self.gpus_used or any(self.power)):
            raise InputError(
                f"replica {self.replica} is dropped but holds stage_tp {self.stage_tp}, local_batch "
                f"{self.local_batch}, gpus_used {self.gpus_used}, power {self.power}; a dropped replica holds no GPU, "
                "sequence or power"
            )
        if len(self.power) != len(self.stage_tp):
            raise InputError(
                f"replica {self.replica} gives {len(self.power)} power multipliers for {len(self.stage_tp)} stages; "
                "it needs one per stage"
            )
        if self.status == "healthy" and any(p != 1.0 for p in self.power):
            raise InputError(f"replica {self.replica} is healthy but runs at power {self.power}; healthy means 1.0")
        return self


class Reshard(BaseModel):
    """NTP's gradient reshard between replicas of different TP degree (per GPU, NVLink)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    bytes_before_per_gpu: float = Field(ge=0, description="Bytes the busiest GPU sends before the DP all-reduce.")
    bytes_after_per_gpu: float = Field(ge=0, description="Bytes it receives back after the all-reduce.")
    time_s: float = Field(ge=0, description="Both directions over NVLink: overlap_s + exposed_s.")
    overlap_s: float = Field(ge=0, description="Part hidden behind the last micro-batch's backward pass.")
    exposed_s: float = Field(ge=0, description="Part left on the step's critical path.")

    @model_validator(mode="after")
    def _parts_sum(self) -> Reshard:
        if not math.isclose(self.overlap_s + self.exposed_s, self.time_s, rel_tol=1e-9, abs_tol=1e-15):
            raise InputError(
                f"reshard overlap_s ({show(self.overlap_s)}) + exposed_s ({show(self.exposed_s)}) != time_s "
                f"({show(self.time_s)}); the two parts make up the reshard"
            )
        return self


class ExpertHosting(BaseModel):
    """One EP group of an MoE plan that lost members in the re-plan (groups not listed keep the
    plan's experts; ``ntp_planner.failures.experts`` describes the choice).

    ``ep_group`` holds the group's surviving ranks of the plan, ``lost`` the ones that no longer run
    (failed, past a reduced TP degree, or in a dropped replica); ``owners`` gives, per expert id,
    the rank of the group holding its shard (one each; empty when the group is dropped)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    stage: Count = Field(description="Pipeline stage of the group.")
    ep_group: list[Count] = Field(description="The group's ranks that still run, ascending.")
    lost: list[Count] = Field(min_length=1, description="The group's ranks that no longer run.")
    owners: list[list[Count]] = Field(description="Per expert id, the ranks holding it (empty when dropped).")
    mode: Literal["rehosted", "dropped"]
    load_factor: float = Field(ge=1, le=1e6, description="Busiest survivor's experts / the plan's per rank.")
    moved_bytes: float = Field(ge=0, description="Expert state (weights, gradient, master, AdamW moments) moved.")
    reason: str = Field(max_length=10_000)

    @model_validator(mode="after")
    def _hosted_by_survivors(self) -> ExpertHosting:
        if self.mode == "dropped" and self.owners:
            raise InputError(f"a dropped EP group of stage {self.stage} hosts experts; a dropped group hosts none")
        if self.mode == "rehosted":
            held = {r for o in self.owners for r in o}
            if not self.owners or any(len(o) != 1 for o in self.owners) or not held <= set(self.ep_group):
                raise InputError(
                    f"the re-hosted EP group {self.ep_group} of stage {self.stage} must hold every expert once, on "
                    f"its surviving ranks; {FIX}"
                )
        return self


class ReplanResult(BaseModel):
    """What every replica does after failures and the GPU of every rank, for one plan (the one
    whose inputs_hash it carries as ``plan_hash``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    plan_hash: str = Field(
        pattern="^[0-9a-f]{64}$", description="inputs_hash of the plan re-planned: `check_against` refuses another."
    )
    policy: Policy
    fallback: Fallback | None = Field(description="The policy that decided degraded replicas under spares, else None.")
    batch: BatchMode
    failed_gpus: Count
    in_domain_spares_used: Count = Field(
        default=0, description="Failed GPUs whose TP ranks moved onto idle GPUs of their own NVLink domain."
    )
    degraded_groups: Count = Field(
        description="TP groups with a failed GPU no in-domain spare stood in for (before spare domains)."
    )
    spares_used: Count = Field(description="Spare domains used, as replacements or as extra replicas.")
    throughput_relative: float = Field(
        ge=0, le=1, description="Samples per second relative to the healthy job (the batch never grows past it)."
    )
    global_batch_target: int = Field(ge=1)
    global_batch_reached: Count
    paused: bool
    healthy_step_time_s: float = Field(gt=0)
    replicas: list[ReplicaState]
    reshard: Reshard | None
    rank_to_gpu: list[Count | None] = Field(description="GPU of every rank of the plan; None = inactive slot.")
    idle_gpus: list[Count] = Field(description="Healthy GPUs not used, free to lend to other work.")
    extra_replicas: int = Field(
        default=0, ge=0, description="Whole replicas formed from spare domains, beyond the plan's dp (not in replicas)."
    )
    spares_note: str | None = Field(default=None, description="How the spare domains were used, or why not.")
    experts: list[ExpertHosting] = Field(
        default_factory=list, description="MoE plans with ep > 1: the EP groups that lost members, and their experts."
    )

    @model_validator(mode="after")
    def _replicas_in_order(self) -> ReplanResult:
        numbers = [x.replica for x in self.replicas]
        if numbers != list(range(len(numbers))):
            given = ", ".join(show(n) for n in numbers[:5]) + (", ..." if len(numbers) > 5 else "")
            raise InputError(f"replicas are numbered {given}; they must be numbered 0, 1, 2, ... in order")
        if self.global_batch_reached > self.global_batch_target:
            raise InputError(
                f"global_batch_reached {self.global_batch_reached} exceeds global_batch_target "
                f"{self.global_batch_target}; a re-plan never grows the batch"
            )
        if (self.fallback is None) != (self.policy != "spares"):
            raise InputError(
                f"policy {self.policy} with fallback {self.fallback or 'null'}: spares needs a fallback, the "
                "other policies none"
            )
        if self.paused != (self.batch == "fixed" and self.global_batch_reached < self.global_batch_target):
            raise InputError(
                f"paused is {str(self.paused).lower()} but batch {self.batch} reaches {self.global_batch_reached} of "
                f"{self.global_batch_target} sequences; a job pauses exactly when a fixed batch falls short"
            )
        self._check_policy_states()
        expected = 0.0 if self.paused else self.global_batch_reached / self.global_batch_target
        if not math.isclose(self.throughput_relative, expected, rel_tol=1e-9, abs_tol=1e-12):
            raise InputError(
                f"throughput_relative {show(self.throughput_relative)} != global_batch_reached "
                f"({self.global_batch_reached}) / global_batch_target ({self.global_batch_target}) = {show(expected)}"
            )
        return self

    def _check_policy_states(self) -> None:
        """The replicas are ones the deciding policy makes: dp-drop degrades none, ntp runs every
        replica at nominal power, ntp-pw only raises it (``Replanner._decide``)."""
        decider = self.fallback if self.policy == "spares" else self.policy
        degraded = [x for x in self.replicas if x.status == "degraded"]
        if decider == "dp-drop" and degraded:
            raise InputError(
                f"replica {degraded[0].replica} is degraded but {decider} decided the replicas, and dp-drop drops "
                "a replica with a failed GPU instead of degrading it"
            )
        for x in degraded:
            bad = [p for p in x.power if p != 1.0] if decider == "ntp" else [p for p in x.power if p < 1.0]
            if bad:
                rule = (
                    "ntp runs every GPU at power 1.0"
                    if decider == "ntp"
                    else "ntp-pw only raises power, to 1.0 or more"
                )
                raise InputError(f"replica {x.replica} runs at power {x.power} but {rule}")

    @classmethod
    def load(cls, path: Path, plan: Plan, verb: str = "use") -> ReplanResult:
        """A re-plan from `ntp replan -o`, checked against the plan it must come from (InputError
        if it is not one, or was made for another plan: ``verb`` the plan it was made from)."""
        data = read_mapping(path, "re-plan", max_bytes=MAX_PLAN_BYTES, kind="JSON")
        check_shown_counts(take_shown_counts(data), plan.model, path, FIX)
        try:
            result = cls.model_validate(data)
        except ValidationError as exc:
            raise InputError(
                f"{path} is not a re-plan written by `ntp replan -o`: {first_error(exc)}; re-plan the plan with "
                "`ntp replan PLAN -o R.json` instead of editing the file"
            ) from None
        if len(result.rank_to_gpu) != plan.layout.world_size:
            raise InputError(
                f"re-plan {path} has {len(result.rank_to_gpu)} ranks but the plan "
                f"has {plan.layout.world_size}; {verb} the plan it was made from"
            )
        result.check_against(plan)
        return result

    def check_against(self, plan: Plan) -> None:
        """Raise InputError unless this re-plan comes from ``plan``: made for it (its hash), one
        entry per replica and rank, every replica's stages at most the plan's TP (all of it when
        healthy), a batch of whole micro-batches no larger than the plan's, ranks on distinct GPUs
        of the cluster and the rank map as wide as every stage's degree."""
        if self.plan_hash != plan.inputs_hash:
            raise InputError(
                f"the re-plan was made for another plan (plan_hash {self.plan_hash[:12]}..., this plan's inputs_hash "
                f"{plan.inputs_hash[:12]}...); {FIX}"
            )
        if not math.isclose(self.healthy_step_time_s, plan.predicted.step_time_s, rel_tol=1e-9):
            raise InputError(
                f"the re-plan's healthy_step_time_s {show(self.healthy_step_time_s)} is not the plan's predicted "
                f"step_time_s {show(plan.predicted.step_time_s)}; {FIX}"
            )
        lay, fix = plan.layout, FIX
        local, cluster = lay.num_micro_batches * lay.micro_batch, plan.cluster.build()
        gpus = cluster.spare_gpus(cluster.num_domains - 1).stop  # the job's ids, then its domains' idle ones
        if len(self.rank_to_gpu) != lay.world_size or len(self.replicas) != lay.dp:
            raise InputError(
                f"the re-plan has {len(self.replicas)} replicas and {len(self.rank_to_gpu)} ranks but the plan has "
                f"dp {lay.dp} and {lay.world_size} ranks; {fix}"
            )
        if self.global_batch_target != lay.global_batch or self.failed_gpus > plan.cluster.num_gpus:
            raise InputError(
                f"the re-plan targets {self.global_batch_target} sequences with {self.failed_gpus} failed GPUs but the "
                f"plan runs {lay.global_batch} on {plan.cluster.num_gpus} GPUs; {fix}"
            )
        grid = lay.rank_grid.array("dp", "pp", "cp", "tp")
        for x in self.replicas:
            self._check_replica(x, plan, local, grid[x.replica])
        placed = [g for g in self.rank_to_gpu if g is not None]
        if any(g >= gpus for g in placed + self.idle_gpus) or len(set(placed)) < len(placed):
            raise InputError(
                f"rank_to_gpu must name distinct GPUs of the plan's cluster, ids 0..{gpus - 1} (its idle in-domain "
                f"spares included), or null; {fix}"
            )
        self._check_experts(plan)
        if set(placed) & set(self.idle_gpus):
            raise InputError(
                f"idle_gpus lists GPU(s) {sorted(set(placed) & set(self.idle_gpus))[:5]} that run ranks; {fix}"
            )

    def _check_experts(self, plan: Plan) -> None:
        """Every listed EP group is one of the plan's, its survivors run and its lost ranks do not,
        and a re-hosted group holds every expert of the model."""
        lay = plan.layout
        if self.experts and not (plan.model.is_moe and lay.ep > 1):
            raise InputError(f"the re-plan re-hosts experts but the plan has no expert parallelism; {FIX}")
        groups = set(lay.rank_grid.expert_groups("ep", lay.ep, lay.expert_tp)) if self.experts else set()
        listed: set[tuple[int, ...]] = set()
        for x in self.experts:
            ranks = sorted(x.ep_group + x.lost)
            if tuple(ranks) not in groups or lay.rank_grid.coords(ranks[0]).pp != x.stage:
                raise InputError(f"ranks {ranks} are not an EP group of the plan's stage {x.stage}; {FIX}")
            if tuple(ranks) in listed:
                raise InputError(f"EP group {ranks} is listed twice; {FIX}")
            listed.add(tuple(ranks))
            running = [r for r in x.ep_group if self.rank_to_gpu[r] is None]
            if running or any(self.rank_to_gpu[r] is not None for r in x.lost):
                raise InputError(
                    f"EP group {ranks} of stage {x.stage} lists a rank that does not run among its survivors, or one "
                    f"that runs among its lost; {FIX}"
                )
            if x.mode == "rehosted" and len(x.owners) != plan.model.num_experts:
                raise InputError(
                    f"EP group {ranks} re-hosts {len(x.owners)} experts but the model has "
                    f"{plan.model.num_experts}; {FIX}"
                )

    def _check_replica(self, x: ReplicaState, plan: Plan, local: int, ranks: np.ndarray) -> None:
        """One replica against the plan: its stages, its batch, and its ranks in the rank map
        (``ranks``: the replica's [pp, cp, tp] ranks; stage s places GPUs on its first stage_tp[s]
        TP ranks only, gpus_used of them in all)."""
        lay, fix = plan.layout, FIX
        if len(x.stage_tp) != lay.pp or (x.status != "dropped" and max(x.stage_tp) > lay.tp):
            raise InputError(
                f"replica {x.replica} runs stage_tp {x.stage_tp} but the plan has {lay.pp} stages of TP "
                f"{lay.tp} (a re-plan runs each at most at {lay.tp}); {fix}"
            )
        if x.status == "healthy" and (x.stage_tp != [lay.tp] * lay.pp or x.local_batch != local):
            raise InputError(
                f"replica {x.replica} is healthy but runs stage_tp {x.stage_tp} with local_batch "
                f"{x.local_batch}; healthy replicas run the plan's TP {lay.tp} and {local} sequences; {fix}"
            )
        if x.status == "degraded" and x.local_batch > local:
            raise InputError(
                f"replica {x.replica} runs local_batch {show(x.local_batch)}; it must be at most the plan's "
                f"{local} sequences; {fix}"
            )
        held = 0
        for s, degree in enumerate(x.stage_tp):
            gpus = [[self.rank_to_gpu[r] for r in group] for group in ranks[s].tolist()]
            past = [
                r
                for group, g in zip(ranks[s].tolist(), gpus, strict=True)
                for r, v in zip(group[degree:], g[degree:], strict=True)
                if v is not None
            ]
            if past:
                raise InputError(
                    f"replica {x.replica} runs stage {s} at TP {degree} but rank_to_gpu gives rank {past[0]} (TP rank "
                    f"{degree} or more) a GPU; {fix}"
                )
            held += sum(v is not None for g in gpus for v in g)
        if held != x.gpus_used or x.gpus_used + x.gpus_idle > lay.pp * lay.cp * lay.tp:
            raise InputError(
                f"replica {x.replica} has gpus_used {x.gpus_used} and gpus_idle {x.gpus_idle} but rank_to_gpu places "
                f"{held} of its {lay.pp * lay.cp * lay.tp} ranks; {fix}"
            )


class ReplanThroughput(BaseModel):
    """What sweeps and the failure simulator need from a re-plan: no rank map, no replica detail."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    throughput_relative: float = Field(description="Samples per second relative to the healthy job.")
    idle_gpus: int = Field(
        description="Healthy GPUs in the replicas' TP slots that run no rank, those of spare domains included."
    )
    spares_used: int = Field(default=0, description="Spare domains used, as replacements or as extra replicas.")
