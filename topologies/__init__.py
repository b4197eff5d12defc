"""WHERE a job runs: GPU and link specs, clusters as graphs, failed GPUs.

This package imports nothing else of ntp-planner; cost_models and ntp_planner build on it.
"""

from topologies.cluster import Cluster, Tier
from topologies.cluster_catalogue import CLUSTERS, ClusterSpec, load_cluster_spec, resolve_cluster_spec
from topologies.errors import InputError
from topologies.gpus import GPUS, GPUSpec, resolve_gpu

__all__ = [
    "CLUSTERS",
    "GPUS",
    "Cluster",
    "ClusterSpec",
    "GPUSpec",
    "InputError",
    "Tier",
    "load_cluster_spec",
    "resolve_cluster_spec",
    "resolve_gpu",
]
