"""The catalogues as tables: `ntp models` and `ntp clusters`. Nothing here prints; the CLI does."""

from __future__ import annotations

from rich import box
from rich.table import Table

from cost_models.model import ModelSpec
from ntp_planner.views.model import billions
from topologies.cluster_catalogue import ClusterSpec


def models_table(models: list[ModelSpec]) -> Table:
    t = Table(title="Models", box=box.SIMPLE_HEAD)
    t.add_column("name", no_wrap=True)
    for col in ("params", "active", "layers", "hidden", "ffn", "heads", "vocab", "MoE"):
        t.add_column(col, justify="right", no_wrap=True)
    for m in models:
        experts = f"{m.num_experts} top-{m.moe_top_k}" if m.is_moe else "-"
        t.add_row(
            m.name,
            billions(m.params_total),
            billions(m.params_active),
            str(m.num_layers),
            str(m.hidden_size),
            str(m.ffn_hidden_size),
            f"{m.num_heads}/{m.num_kv_heads}",
            str(m.vocab_size),
            experts,
        )
    return t


def clusters_table(specs: list[ClusterSpec]) -> Table:
    t = Table(title="Clusters (bandwidths per GPU, one way)", box=box.SIMPLE_HEAD)
    t.add_column("name", no_wrap=True)
    for col in ("GPU", "NVLink domain", "GPUs/node", "NVLink", "scale-out", "description"):
        t.add_column(col, justify="right" if col in ("NVLink domain", "GPUs/node", "NVLink", "scale-out") else "left")
    for c in specs:
        t.add_row(
            c.name,
            c.gpu,
            str(c.domain_size),
            str(c.gpus_per_node),
            f"{c.nvlink_bw_bytes_per_s / 1e9:.0f} GB/s",
            f"{c.scaleout_bw_bytes_per_s / 1e9:.0f} GB/s",
            c.description,
        )
    return t
