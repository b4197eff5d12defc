"""Cluster catalogue and custom cluster files.

A ``ClusterSpec`` describes one building block repeated to any size: an NVLink domain of
``domain_size`` GPUs, hosts of ``gpus_per_node`` GPUs with one NIC per GPU, and a
rail-optimized InfiniBand fat tree (rail r of every host in a scalable unit meets at one leaf
switch; leaves meet at spines). Bandwidths are per GPU and per direction: NVIDIA quotes NVLink
as the bidirectional sum ("900 GB/s" on H100 = 450 GB/s each way), so we halve it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from topologies.bounds import Bound, bounds_validator
from topologies.errors import InputError
from topologies.files import read_mapping
from topologies.gpus import GPUS, GPUSpec, resolve_gpu
from topologies.naming import lookup

_GBIT = 1e9 / 8  # bytes/s in one Gb/s


# Wide ranges: they catch typos and wrong units (Gb/s for bytes/s, ms for s), never a real design.
# A bandwidth near zero makes every collective last forever; an unbounded one makes it free.
_BW_WHY = "NVLink moves 3e11 to 9e11 bytes/s per GPU each way and NICs 2.5e10 to 1e11; is the unit bytes/s?"
_LAT_WHY = "a message step takes microseconds (1e-6 s); is the unit seconds?"
_SIZE_WHY = "NVLink domains and hosts hold 4 to 72 GPUs today"
_BOUNDS: dict[str, Bound] = {
    "domain_size": Bound(1, 4096, "GPUs", _SIZE_WHY),
    "gpus_per_node": Bound(1, 4096, "GPUs", _SIZE_WHY),
    "nvlink_bw_bytes_per_s": Bound(1e8, 1e14, "bytes/s", _BW_WHY),
    "scaleout_bw_bytes_per_s": Bound(1e8, 1e14, "bytes/s", _BW_WHY),
    "nvlink_latency_s": Bound(0, 1, "s", _LAT_WHY),
    "scaleout_latency_s": Bound(0, 1, "s", _LAT_WHY),
    "nodes_per_leaf": Bound(1, 100_000, "hosts", "a leaf switch serves 32 hosts in NVIDIA's SuperPOD"),
    "spine_oversubscription": Bound(1, 1000, "x", "1 is full bisection; fat trees are built at 1 to 4"),
}


class ClusterSpec(BaseModel):
    """A cluster design; the GPU count is chosen when a ``Cluster`` is built from it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    name: str = Field(min_length=1, max_length=255, description="Catalogue name, e.g. 'dgx-h100'.")
    description: str = Field(default="", max_length=10_000, description="One line for `ntp clusters`.")
    gpu: str = Field(max_length=100, description="GPU catalogue name, e.g. 'H100-SXM', or custom_gpu's name.")
    custom_gpu: GPUSpec | None = Field(
        default=None,
        description="An accelerator not in the catalogue, written out (a local cluster from `ntp profile`: a CPU "
        "host's measured rates); its name must equal ``gpu``.",
    )
    domain_size: int = Field(gt=0, description="GPUs per NVLink (scale-up) domain.")
    gpus_per_node: int = Field(gt=0, description="GPUs per host; also the number of rails.")
    nvlink_bw_bytes_per_s: float = Field(gt=0, description="NVLink bandwidth per GPU, one way.")
    nvlink_latency_s: float = Field(ge=0, description="Latency of one NVLink message step.")
    scaleout_bw_bytes_per_s: float = Field(gt=0, description="NIC bandwidth per GPU, one way.")
    scaleout_latency_s: float = Field(ge=0, description="Latency of one scale-out message step.")
    nodes_per_leaf: int = Field(
        default=32, gt=0, description="Hosts whose rail-r NICs share one leaf switch (a scalable unit)."
    )
    spine_oversubscription: float = Field(
        default=1.0, ge=1.0, description="Leaf downlink:uplink ratio; 1 means full bisection."
    )
    sources: dict[str, str] = Field(default_factory=dict, description="Field -> source of the figure.")

    _bounds = bounds_validator(_BOUNDS)

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        if self.custom_gpu is not None:
            if self.custom_gpu.name != self.gpu:
                raise InputError(
                    f"gpu {self.gpu!r} must name the custom_gpu written in the file ({self.custom_gpu.name!r})"
                )
        elif self.gpu.lower() not in {g.lower() for g in GPUS}:
            resolve_gpu(self.gpu)  # raises with a suggestion
        big, small = max(self.domain_size, self.gpus_per_node), min(self.domain_size, self.gpus_per_node)
        if big % small:
            raise InputError(
                f"domain_size ({self.domain_size}) and gpus_per_node ({self.gpus_per_node}) must divide "
                "one another: a host lies inside one NVLink domain or a domain inside one host"
            )
        return self

    @property
    def gpu_spec(self) -> GPUSpec:
        return self.custom_gpu if self.custom_gpu is not None else resolve_gpu(self.gpu)


_LAT_NVL = "assumed: ~1 us per NVSwitch message step (order of nccl-tests small-message latency)"
_LAT_IB = "assumed: ~5 us per InfiniBand message step (switch + NIC, nccl-tests order)"


def _spec(name, description, gpu, domain, per_node, nvlink_bidir_gb, nic_gbit, src_nvl, src_nic, extra_sources):
    """One catalogue row -> ClusterSpec, converting datasheet units to bytes/s one way."""
    return ClusterSpec(
        name=name,
        description=description,
        gpu=gpu,
        domain_size=domain,
        gpus_per_node=per_node,
        nvlink_bw_bytes_per_s=nvlink_bidir_gb * 1e9 / 2,
        nvlink_latency_s=1e-6,
        scaleout_bw_bytes_per_s=nic_gbit * _GBIT,
        scaleout_latency_s=5e-6,
        sources={
            "nvlink_bw_bytes_per_s": f"{src_nvl} ({nvlink_bidir_gb:g} GB/s bidirectional, halved)",
            "scaleout_bw_bytes_per_s": f"{src_nic} ({nic_gbit:g} Gb/s per GPU)",
            "nvlink_latency_s": _LAT_NVL,
            "scaleout_latency_s": _LAT_IB,
            "nodes_per_leaf": "NVIDIA DGX SuperPOD reference architecture: 32-node scalable units",
            **extra_sources,
        },
    )


# fmt: off
_TABLE = [
    # name, description, GPU, NVLink domain, GPUs per host, NVLink GB/s (bidirectional), NIC Gb/s per GPU,
    # source of the NVLink figure, source of the NIC figure, extra sources
    ("dgx-a100", "DGX A100 80GB, NVLink3 in 8-GPU nodes, 8x HDR 200 Gb/s", "A100-SXM4-80GB", 8, 8, 600, 200,
     "DGX A100 datasheet: NVSwitch 600 GB/s per GPU", "DGX A100 datasheet: 8x ConnectX-6 HDR 200 Gb/s", {}),
    ("dgx-h100", "DGX H100, NVLink4 in 8-GPU nodes, 8x NDR 400 Gb/s", "H100-SXM", 8, 8, 900, 400,
     "DGX H100 datasheet: NVLink 900 GB/s per GPU", "DGX H100 datasheet: 8x ConnectX-7 400 Gb/s", {}),
    ("hgx-h200", "HGX H200, NVLink4 in 8-GPU nodes, 8x NDR 400 Gb/s", "H200", 8, 8, 900, 400,
     "HGX H200 specifications: NVLink 900 GB/s per GPU",
     "HGX H200 reference design: one ConnectX-7 400 Gb/s per GPU", {}),
    ("dgx-b200", "DGX B200, NVLink5 in 8-GPU nodes, 8x NDR 400 Gb/s", "B200", 8, 8, 1800, 400,
     "DGX B200 datasheet: NVLink5 1.8 TB/s per GPU", "DGX B200 datasheet: 8x ConnectX-7 400 Gb/s", {}),
    ("gb200-nvl72", "GB200 NVL72 racks: 72-GPU NVLink domain, 4-GPU trays", "GB200", 72, 4, 1800, 400,
     "GB200 NVL72 specifications: NVLink5 1.8 TB/s per GPU",
     "GB200 NVL72 reference design: one ConnectX-7 400 Gb/s per GPU",
     {"domain_size": "GB200 NVL72: 72 GPUs in one NVLink domain, 18 trays of 4"}),
    ("dgx-b300", "DGX B300, NVLink5 in 8-GPU nodes, 8x ConnectX-8 800 Gb/s", "B300", 8, 8, 1800, 800,
     "DGX B300 datasheet: NVLink5 1.8 TB/s per GPU (14.4 TB/s per 8 GPUs)",
     "DGX B300 datasheet: 8x ConnectX-8 SuperNIC, 800 Gb/s InfiniBand/Ethernet each", {}),
    ("gb300-nvl72", "GB300 NVL72 racks: 72-GPU NVLink domain, 4-GPU trays, ConnectX-8 800 Gb/s", "GB300", 72, 4,
     1800, 800, "GB300 NVL72 specifications: NVLink5 1.8 TB/s per GPU (130 TB/s per 72 GPUs)",
     "GB300 NVL72 specifications: 72 ConnectX-8 SuperNICs, one 800 Gb/s per GPU",
     {"domain_size": "GB300 NVL72: 72 GPUs in one NVLink domain, 18 compute trays of 4 (2 Grace + 4 Blackwell "
      "Ultra each)",
      "gpus_per_node": "GB300 NVL72: a compute tray holds 4 GPUs"}),
    ("b200-nvl32", "NTP study cluster: 32-GPU NVLink domains of B200, 800 Gb/s per GPU", "B200", 32, 8, 1800, 800,
     "NTP paper (arXiv 2504.06095) setup: NVLink 1.8 TB/s per GPU",
     "NTP paper (arXiv 2504.06095) setup: one 800 Gb/s InfiniBand NIC per GPU",
     {"domain_size": "NTP paper (arXiv 2504.06095): NVL domains of 32 GPUs",
      "gpus_per_node": "assumed: 8-GPU hosts, 4 per NVL32 domain"}),
]
# fmt: on

CLUSTERS: dict[str, ClusterSpec] = {row[0]: _spec(*row) for row in _TABLE}


def load_cluster_spec(path: Path) -> ClusterSpec:
    """Read a custom cluster from a YAML or JSON file with ``ClusterSpec``'s fields."""
    path = Path(path)
    data = read_mapping(path, "cluster file")
    data.setdefault("name", path.stem)
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"cluster file {path}: {first_error(exc)}") from None


def first_error(exc: ValidationError) -> str:
    """One sentence from a pydantic error: the field path and what is wrong with it."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ").splitlines()[0]
    return f"{where}: {msg}" if where else msg


def resolve_cluster_spec(name_or_path: str) -> ClusterSpec:
    """A catalogue name, or a path to a ``.yaml``/``.yml``/``.json`` file. A catalogue name wins
    over a file or folder of the same name in the working folder; write ``./dgx-h100`` for the file."""
    if name_or_path in CLUSTERS:
        return CLUSTERS[name_or_path]
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml", ".json"} or path.exists():
        return load_cluster_spec(path)
    return lookup(CLUSTERS, name_or_path, "cluster", "Or give the path of a YAML or JSON cluster file.")
