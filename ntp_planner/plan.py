"""Plan: the one artifact. Inputs (model, training, cluster), the chosen layout, where each rank
runs, the predicted cost, and the runner-up layouts. Emitters, the executor and the simulator
read only this file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from cost_models.step import StepCost
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster
from topologies.clusters import ClusterSpec, first_error

SCHEMA_VERSION = 1


class ClusterInputs(BaseModel):
    """The cluster as the plan saw it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: ClusterSpec
    num_gpus: int
    gpus_per_domain: int | None = Field(
        default=None, description="GPUs used in each NVLink domain; None (and plans older than it) = all."
    )
    failed_gpus: list[int] = Field(default_factory=list)

    def build(self) -> Cluster:
        return Cluster(
            spec=self.spec,
            num_gpus=self.num_gpus,
            gpus_per_domain=self.gpus_per_domain,
            failed_gpus=frozenset(self.failed_gpus),
        )


class RunnerUp(BaseModel):
    """A layout that lost, with the numbers it lost on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layout: ParallelLayout
    step_time_s: float
    mfu: float
    tokens_per_s: float
    memory_per_gpu_bytes: float
    time_breakdown_s: dict[str, float]


class GoodputEntry(BaseModel):
    """A candidate layout ranked by throughput under failures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layout: ParallelLayout
    tokens_per_s: float = Field(description="Failure-free throughput.")
    capacity_goodput: float = Field(description="Expected useful share under failures (short simulation).")
    effective_tokens_per_s: float = Field(description="tokens_per_s x capacity_goodput.")


class Plan(BaseModel):
    """A layout for one model on one cluster, with its predicted cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Bumped on incompatible changes.")
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterInputs
    inputs_hash: str = Field(description="sha256 of the canonical JSON of model, training and cluster.")
    headroom: float = Field(description="Fraction of HBM kept free when the plan was made.")
    layout: ParallelLayout
    placement: list[int] = Field(description="GPU id of each rank, in the project's rank order.")
    per_layer_tp: list[int] = Field(description="TP degree of every block: embedding, each layer, LM head.")
    predicted: StepCost
    runners_up: list[RunnerUp] = Field(default_factory=list)
    megatron: RunnerUp | None = Field(
        default=None, description="Best layout Megatron-LM can run (one TP degree for all layers), when it differs."
    )
    source: str = Field(description="'search' (ntp plan) or 'user' (ntp estimate -o).")
    objective: str = Field(default="step-time", description="What the search maximised: step-time or goodput.")
    goodput_strategy: str | None = Field(default=None, description="Failure strategy the goodput ranking assumed.")
    goodput_ranking: list[GoodputEntry] = Field(
        default_factory=list, description="Candidates by effective tokens/s under failures (objective goodput)."
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
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ValueError(f"cannot read plan {path}: {exc.strerror}.") from None
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"plan {path} is not valid JSON ({exc.msg}, line {exc.lineno}); re-create it with `ntp plan -o`."
            ) from None
        if not isinstance(data, dict) or "schema_version" not in data:
            raise ValueError(f"{path} is not an ntp plan (no schema_version); create one with `ntp plan -o`.")
        if data["schema_version"] != SCHEMA_VERSION:
            raise ValueError(
                f"plan {path} has schema version {data['schema_version']}, this ntp reads version "
                f"{SCHEMA_VERSION}; re-create it with this version's `ntp plan -o`."
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"plan {path} is malformed: {first_error(exc)}.") from None


def inputs_hash(model: ModelSpec, training: TrainingSpec, cluster: ClusterInputs) -> str:
    """sha256 of the inputs; a field added later is left out while it holds its default, so
    the inputs of older plans keep their hash."""
    blob = json.dumps(
        {
            "model": model.model_dump(mode="json"),
            "training": training.model_dump(mode="json"),
            "cluster": cluster.model_dump(
                mode="json", exclude={"gpus_per_domain"} if cluster.gpus_per_domain is None else None
            ),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"cannot write {path}: folder {folder} does not exist.")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file a plain open()'s mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
