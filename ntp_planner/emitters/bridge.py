"""Megatron-Bridge: a YAML override with model.*, train.*, dataset.* and ddp.* sections."""

from __future__ import annotations

import yaml

from ntp_planner.emitters.common import Export, comment_safe, expressible_layout, mcore_fields
from ntp_planner.plan import Plan


def emit(plan: Plan, replan=None, data_path: str | None = None, save_dir: str | None = None) -> Export:
    layout, warnings = expressible_layout(plan, "Megatron-Bridge")
    model = {k: v for k, v in mcore_fields(plan, layout).items() if v is not None}
    model["pipeline_dtype"] = "bf16" if plan.training.dtype != "fp16" else "fp16"
    config = {
        "model": model,
        "train": {"global_batch_size": layout.global_batch, "micro_batch_size": layout.micro_batch},
        "dataset": {"seq_length": plan.training.seq_len, **({"data_path": data_path} if data_path else {})},
        "ddp": {
            "use_distributed_optimizer": layout.distributed_optimizer,
            "overlap_grad_reduce": layout.overlap_grad_reduce and layout.distributed_optimizer,
            "overlap_param_gather": layout.overlap_grad_reduce and layout.distributed_optimizer,
        },
        "checkpoint": {"save": save_dir or f"checkpoints/{plan.model.name}"},
    }
    header = comment_safe(f"# ntp-planner plan {plan.inputs_hash[:12]}: {plan.model.name}, {layout.describe()}") + "\n"
    return Export(files={"bridge_override.yaml": header + yaml.safe_dump(config, sort_keys=False)}, warnings=warnings)
