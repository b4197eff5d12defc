"""What every target needs from a Plan: the layout it can express, and the launch geometry."""

from __future__ import annotations

from dataclasses import dataclass, field

from cost_models.layout import ParallelLayout
from ntp_planner.emitters.moe import attention_fields, model_fields, moe_fields
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


SHARDING_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}  # Megatron-FSDP's names for ZeRO-2 / ZeRO-3


def pipeline_split(layout: ParallelLayout, num_layers: int, mtp_layers: int = 0) -> dict:
    """How Megatron-Core says where the layers live, in its config field names: nothing for an
    equal split, the embedding / loss counted as layers, first and last stage counts (no
    interleaving), or an explicit layout string. A layout string names the ``mtp_layers``
    multi-token prediction modules too ("m", megatron-core counts them against mtp_num_layers),
    before the loss on the last stage, where the cost model holds them.

    >>> pipeline_split(ParallelLayout(pp=2, dp=1, global_batch=1, pp_layers=(3, 5)), 8, mtp_layers=1)
    {'pipeline_model_parallel_layout': 'Ettt|tttttmL'}
    """
    from cost_models.pipeline_layout import format_layout, megatron_splits

    chunks = layout.chunks(num_layers)
    vpp = {"virtual_pipeline_model_parallel_size": layout.vpp} if layout.vpp > 1 else {}
    if layout.pp == 1 or len(set(chunks)) == 1:
        return vpp
    for (embedding, loss), split in megatron_splits(num_layers, layout.pp, layout.vpp).items():
        if split == chunks:
            flags = {"account_for_embedding_in_pipeline_split": embedding, "account_for_loss_in_pipeline_split": loss}
            return {**{k: v for k, v in flags.items() if v}, **vpp}
    counts = layout.stage_layers(num_layers)
    middle = counts[1:-1]
    if layout.vpp == 1 and len(middle) >= 1 and len(set(middle)) == 1:
        fields = {}
        if counts[0] != middle[0]:
            fields["num_layers_in_first_pipeline_stage"] = counts[0]
        if counts[-1] != middle[0]:
            fields["num_layers_in_last_pipeline_stage"] = counts[-1]
        return fields
    text = format_layout(chunks, layout.pp)
    return {"pipeline_model_parallel_layout": text[: -len("L")] + "m" * mtp_layers + "L"}


def sharding_fields(layout: ParallelLayout) -> dict:
    """Megatron-Core DDP config fields for the layout's ZeRO level (Megatron-FSDP for 2 and 3)."""
    fields = {
        "use_distributed_optimizer": layout.zero >= 1,
        "overlap_grad_reduce": layout.overlap_grad_reduce,
        "overlap_param_gather": layout.overlap_grad_reduce and layout.zero >= 1,
    }
    if layout.zero >= 2:
        fields.update(use_megatron_fsdp=True, data_parallel_sharding_strategy=SHARDING_STRATEGY[layout.zero])
    return fields


def sharding_warnings(layout: ParallelLayout, target: str) -> list[str]:
    if layout.zero == 3 and not layout.reshard_after_forward:
        return [
            f"{target}'s Megatron-FSDP gathers the weights again for backward; the plan keeps them after forward "
            "(torch FSDP2's reshard_after_forward=False), so expect one more all-gather per micro-batch"
        ]
    return []


def mcore_fields(plan: Plan, layout: ParallelLayout) -> dict:
    """megatron-core TransformerConfig / parallelism field names for ``layout`` (NeMo 1.x forwards
    model.* keys of these names, Megatron-Bridge takes them under model.*). ``apply_rope_fusion`` is
    given only when the plan turns it off: the recipes' providers set their own default otherwise."""
    m = plan.model
    fields = {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
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
    fields.update(pipeline_split(layout, m.num_layers, m.mtp_layers))
    fields.update({k: v for k, v in moe_fields(plan, layout).items() if v is not None})
    fields.update(attention_fields(m))
    fields.update(model_fields(m))
    if not plan.training.rope_fusion:  # TrainingSpec.rope_fusion: the unfused rotation the plan costed (YaRN)
        fields["apply_rope_fusion"] = False
    return fields


PRECISION_NAMES = {
    "bf16": "bf16-mixed",
    "fp16": "16-mixed",
    "fp8": "bf16-mixed",
    "mxfp8": "bf16-mixed",
    "nvfp4": "bf16-mixed",
}


def low_precision_fields(plan: Plan) -> dict:
    """Megatron-Core / Transformer Engine fields of the plan's number format (config names)."""
    t = plan.training
    fields: dict = {}
    if t.dtype == "fp8":
        fields = {"fp8": "hybrid", "fp8_recipe": "tensorwise" if t.fp8_recipe == "current" else "delayed"}
    elif t.dtype == "mxfp8":
        fields = {"fp8": "e4m3", "fp8_recipe": "mxfp8"}
    elif t.dtype == "nvfp4":
        fields = {"fp4": "e2m1", "fp4_recipe": "nvfp4"}
    if t.fp8_params and t.low_precision:
        fields["fp4_param_gather" if t.dtype == "nvfp4" else "fp8_param_gather"] = True
    return fields


def comment_safe(text: str) -> str:
    """Text for a one-line comment: control characters (a newline would end the comment) -> '?'."""
    return "".join(c if c.isprintable() else "?" for c in text)
