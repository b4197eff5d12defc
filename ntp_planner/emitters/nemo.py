"""NeMo 1.x: a Hydra YAML with trainer.* and model.* (shared/reference/formats.md)."""

from __future__ import annotations

import yaml

from ntp_planner.emitters.common import (
    PRECISION_NAMES,
    Export,
    comment_safe,
    expressible_layout,
    launch_geometry,
    mcore_fields,
)
from ntp_planner.plan import Plan


def emit(plan: Plan, replan=None, data_path: str | None = None, save_dir: str | None = None) -> Export:
    layout, warnings = expressible_layout(plan, "NeMo")
    hosts, per_host = launch_geometry(plan)
    m, t = plan.model, plan.training
    model = {
        **mcore_fields(plan, layout),
        "micro_batch_size": layout.micro_batch,
        "global_batch_size": layout.global_batch,
        "encoder_seq_length": t.seq_len,
        "max_position_embeddings": max(m.max_position_embeddings, t.seq_len),
        "normalization": m.norm,
        "activation": "fast-swiglu" if m.gated_mlp else "gelu",
        "bias": m.bias,
        "position_embedding_type": "rope" if m.position == "rope" else "learned_absolute",
        "share_embeddings_and_output_weights": m.tie_embeddings,
        "activations_checkpoint_granularity": None if layout.recompute == "none" else layout.recompute,
        "activations_checkpoint_method": "uniform" if layout.recompute == "full" else None,
        "activations_checkpoint_num_layers": 1 if layout.recompute == "full" else None,
        "optim": {"name": "distributed_fused_adam" if layout.distributed_optimizer else "fused_adam"},
    }
    if data_path:
        model["data"] = {"data_prefix": [data_path]}
    config = {
        "trainer": {"devices": per_host, "num_nodes": hosts, "precision": PRECISION_NAMES[t.dtype]},
        "exp_manager": {"exp_dir": save_dir or f"checkpoints/{m.name}"},
        "model": model,
    }
    header = comment_safe(f"# ntp-planner plan {plan.inputs_hash[:12]}: {m.name}, {layout.describe()}") + "\n"
    return Export(files={"nemo_config.yaml": header + yaml.safe_dump(config, sort_keys=False)}, warnings=warnings)
