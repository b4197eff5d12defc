"""One published training run (``PublishedRow``) and the layout rules the NeMo and
Megatron-Bridge tables share: what ``cost_models.published`` (tables A-D),
``cost_models.published_runs`` (table E) and ``cost_models.published_dgxc`` (table F) are made
of. Apart from them so that the tables import it and ``published.all_tables`` imports the
tables, with no circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from cost_models.pipeline_layout import megatron_split, parse_layout
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS


@dataclass(frozen=True)
class PublishedRow:
    """One published run: what ran, on what, how fast."""

    table: str
    model: ModelSpec
    cluster_name: str
    gpus: int
    training: TrainingSpec
    layout: ParallelLayout
    measured_step_time_s: float
    source: str
    gpus_per_domain: int | None = None

    @cached_property
    def cluster(self) -> Cluster:
        return Cluster(spec=CLUSTERS[self.cluster_name], num_gpus=self.gpus, gpus_per_domain=self.gpus_per_domain)


def run_layout(gpus: int, batch: int, mb: int, tp: int, pp: int, cp: int, vp: int, **kw) -> ParallelLayout:
    """The layout of a NeMo / Megatron-Bridge performance run: the table's columns, dp from the
    GPU count, sequence parallelism whenever tp > 1 (every such recipe sets it)."""
    return ParallelLayout(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=gpus // (tp * pp * cp),
        micro_batch=mb,
        global_batch=batch,
        vpp=vp,
        sequence_parallel=tp > 1,
        **kw,
    )


def recipe_chunks(name: str, system: str, pp: int, vp: int, batch: int) -> tuple[int, ...] | None:
    """Megatron-Bridge's pipeline splits: 405B counts the embedding and the loss as layers
    (account_for_*_in_pipeline_split); 70B on H100 at GBS 256 runs an explicit layout."""
    if name == "llama3.1-405b" and pp > 1:
        return megatron_split(MODELS[name].num_layers, pp, vp, embedding=True, loss=True)
    if name == "llama3-70b" and system == "H100" and batch == 256 and pp == 8:
        return parse_layout("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", pp)
    return None
