"""What every target needs from a Plan: the layout it can express, and the launch geometry."""

from __future__ import annotations

from dataclasses import dataclass, field

from cost_models.layout import ParallelLayout
from ntp_planner.plan import Plan


@dataclass
class Export:
    """Files to write (name -> text) and warnings to print."""

    files: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def expressible_layout(plan: Plan, target: str) -> tuple[ParallelLayout, list[str]]:
    """The plan's layout, or, for per-layer TP (one degree per dense layer is all Megatron-style
    frameworks run), its Megatron-expressible projection, with a warning giving the cost."""
    lay = plan.layout
    if not lay.is_per_layer:
        return lay.model_copy(update={"layer_tp": None}), []
    if plan.megatron is not None:
        projected = plan.megatron.layout
        lower = 1 - 1 / (1 + plan.megatron_gap)
        note = (
            f"predicted {lower:.1%} lower throughput ({plan.megatron.step_time_s:.3f} s vs "
            f"{plan.predicted.step_time_s:.3f} s per step)"
        )
    else:
        projected, note = lay.model_copy(update={"layer_tp": None}), "throughput difference not predicted"
    warning = (
        f"{target} runs one TP degree for every dense layer; the per-layer plan ({lay.describe()}) is "
        f"exported as its Megatron-expressible projection {projected.describe()}: {note}"
    )
    return projected, [warning]


def launch_geometry(plan: Plan) -> tuple[int, int]:
    """(hosts, GPUs per host) for torchrun."""
    per_node = plan.cluster.spec.gpus_per_node
    return plan.cluster.num_gpus // per_node, per_node


def mcore_fields(plan: Plan, layout: ParallelLayout) -> dict:
    """megatron-core TransformerConfig / parallelism field names for ``layout`` (NeMo 1.x forwards
    model.* keys of these names, Megatron-Bridge takes them under model.*)."""
    m = plan.model
    counts = layout.stage_layers(m.num_layers)
    fields = {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.vpp if layout.vpp > 1 else None,
        "context_parallel_size": layout.cp,
        "expert_model_parallel_size": layout.ep,
        "sequence_parallel": layout.sequence_parallel,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_heads,
        "num_query_groups": m.num_kv_heads,
        "kv_channels": m.head_dim,
        "recompute_granularity": None if layout.recompute == "none" else layout.recompute,
        "recompute_method": "uniform" if layout.recompute == "full" else None,
        "recompute_num_layers": 1 if layout.recompute == "full" else None,
    }
    if layout.pp > 1 and len(set(counts)) > 1:
        fields["num_layers_in_first_pipeline_stage"] = counts[0]
        fields["num_layers_in_last_pipeline_stage"] = counts[-1]
    if m.is_moe:
        fields.update(
            num_moe_experts=m.num_experts, moe_router_topk=m.moe_top_k, moe_ffn_hidden_size=m.moe_ffn_hidden_size
        )
    return fields


PRECISION_NAMES = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp8": "bf16-mixed"}


def comment_safe(text: str) -> str:
    """Text for a one-line comment: control characters (a newline would end the comment) -> '?'."""
    return "".join(c if c.isprintable() else "?" for c in text)
