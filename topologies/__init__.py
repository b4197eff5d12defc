"""WHERE a job runs: GPU and link specs, clusters as graphs, failed GPUs.

This package imports nothing else of ntp-planner; cost_models and ntp_planner build on it. Its
names load on first use (PEP 562), so importing ``topologies.errors`` alone stays cheap and
`ntp --help` does not pay for numpy and the catalogues.
"""

from importlib import import_module

_WHERE = {
    "Cluster": "topologies.cluster",
    "Tier": "topologies.cluster",
    "CLUSTERS": "topologies.cluster_catalogue",
    "ClusterSpec": "topologies.cluster_catalogue",
    "load_cluster_spec": "topologies.cluster_catalogue",
    "resolve_cluster_spec": "topologies.cluster_catalogue",
    "InputError": "topologies.errors",
    "GPUS": "topologies.gpus",
    "GPUSpec": "topologies.gpus",
    "resolve_gpu": "topologies.gpus",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'topologies' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
