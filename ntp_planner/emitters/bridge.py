"""Megatron-Bridge: a YAML override with model.*, train.*, dataset.* and ddp.* sections."""

from __future__ import annotations

import yaml

from ntp_planner.emitters.common import (
    Export,
    comment_safe,
    expressible_layout,
    low_precision_fields,
    mcore_fields,
    sharding_fields,
    sharding_warnings,
)
from ntp_planner.emitters.moe import MLA_NOTE, moe_warnings
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult


def emit(
    plan: Plan, replan: ReplanResult | None = None, data_path: str | None = None, save_dir: str | None = None
) -> Export:
    layout, warnings = expressible_layout(plan, "Megatron-Bridge")
    warnings += sharding_warnings(layout, "Megatron-Bridge")
    warnings += moe_warnings(plan, layout, "Megatron-Bridge")
    if plan.model.is_mla:
        provider = "an MLA model provider (DeepSeekV3ModelProvider)"
        warnings.append(MLA_NOTE.format(target="Megatron-Bridge", config=provider))
    model = {k: list(v) if isinstance(v, tuple) else v for k, v in mcore_fields(plan, layout).items() if v is not None}
    ddp = {**sharding_fields(layout), "grad_reduce_in_fp32": plan.training.grad_bytes == 4}
    precision = {**low_precision_fields(plan), "grad_reduce_in_fp32": plan.training.grad_bytes == 4}
    model["pipeline_dtype"] = "bf16" if plan.training.dtype != "fp16" else "fp16"
    config = {
        "model": model,
        "train": {"global_batch_size": layout.global_batch, "micro_batch_size": layout.micro_batch},
        "dataset": {"seq_length": plan.training.seq_len, **({"data_path": data_path} if data_path else {})},
        "ddp": ddp,
        "mixed_precision": precision,
        **({"dist": {"use_megatron_fsdp": True}} if ddp.get("use_megatron_fsdp") else {}),
        "checkpoint": {"save": save_dir or f"checkpoints/{plan.model.name}"},
    }
    header = comment_safe(f"# ntp-planner plan {plan.inputs_hash[:12]}: {plan.model.name}, {layout.describe()}") + "\n"
    return Export(files={"bridge_override.yaml": header + yaml.safe_dump(config, sort_keys=False)}, warnings=warnings)
