"""NeMo 1.x: a Hydra YAML with trainer.* and model.* (shared/reference/formats.md), for
nemo-toolkit 1.x's megatron_gpt_pretraining.py. NeMo 2.x trains from Python recipes
(``emitters.nemo2``), NeMo 3 from Megatron-Bridge's (``emitters.bridge``)."""

from __future__ import annotations

import yaml

from ntp_planner.emitters.common import (
    PRECISION_NAMES,
    Export,
    comment_safe,
    expressible_layout,
    launch_geometry,
    mcore_fields,
    sharding_warnings,
)
from ntp_planner.emitters.moe import moe_warnings, supported
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult
from topologies.errors import InputError

FSDP_STRATEGY = {2: "grad", 3: "full"}  # NeMo 1.x model.fsdp_sharding_strategy for ZeRO-2 / ZeRO-3
VERSIONS = "NeMo 1.x (nemo-toolkit 1.x, megatron_gpt_pretraining.py); NeMo 2.x: --format nemo2, NeMo 3: --format bridge"


# NeMo 1.x's model.activation names: gated MLPs (by ModelSpec.gate_activation; it has no quick GELU,
# so GPT-OSS's gate goes as the tanh GELU one, with a warning) and plain ones (mlp_activation)
GATES = {"silu": "fast-swiglu", "gelu": "fast-geglu", "quick_gelu": "fast-geglu"}
PLAIN = {"gelu": "gelu", "squared_relu": "squared-relu"}


def emit(
    plan: Plan, replan: ReplanResult | None = None, data_path: str | None = None, save_dir: str | None = None
) -> Export:
    layout, warnings = expressible_layout(plan, "NeMo")
    if layout.zero >= 2 and layout.pp > 1:
        raise InputError(
            f"NeMo 1.x runs FSDP (this plan's ZeRO-{layout.zero}) only without pipeline parallelism, and this plan "
            f"has pp {layout.pp}: export it with --format nemo2, bridge or megatron, or re-plan with pp 1"
        )
    warnings += sharding_warnings(layout, "NeMo")
    hosts, per_host = launch_geometry(plan)
    m, t = plan.model, plan.training
    if t.dtype in ("mxfp8", "nvfp4"):
        warnings.append(f"NeMo 1.x has no {t.dtype} recipe (Blackwell block scaling came with NeMo 2); exported as fp8")
    fields, dropped = supported(mcore_fields(plan, layout), "NeMo", layout.folded)
    if m.gated_mlp and m.gate_activation == "quick_gelu":
        warnings.append(
            f"NeMo 1.x has no quick-GELU gate ({m.name}'s): exported as fast-geglu (tanh-approximated GELU)"
        )
    warnings += dropped + moe_warnings(plan, layout, "NeMo")
    # NeMo 1.x's own spellings: the rotary share is rotary_percentage, a zero-centred LayerNorm layernorm1p
    rotary = {"rotary_percentage": fields.pop("rotary_percent")} if "rotary_percent" in fields else {}
    one_p = m.norm_zero_centered and m.norm == "layernorm"
    model = {
        **fields,
        **rotary,
        "micro_batch_size": layout.micro_batch,
        "global_batch_size": layout.global_batch,
        "encoder_seq_length": t.seq_len,
        "max_position_embeddings": max(m.max_position_embeddings, t.seq_len),
        "normalization": "layernorm1p" if one_p else m.norm,
        "activation": GATES[m.gate_activation] if m.gated_mlp else PLAIN[m.mlp_activation],
        "bias": m.bias,
        "position_embedding_type": "rope" if m.position == "rope" else "learned_absolute",
        "share_embeddings_and_output_weights": m.tie_embeddings,
        "activations_checkpoint_granularity": None if layout.recompute == "none" else layout.recompute,
        "activations_checkpoint_method": "uniform" if layout.recompute == "full" else None,
        "activations_checkpoint_num_layers": 1 if layout.recompute == "full" else None,
        "optim": {"name": "distributed_fused_adam" if layout.distributed_optimizer else "fused_adam"},
    }
    if t.grad_bytes == 2 and t.dtype != "fp16" and layout.distributed_optimizer:
        model["optim"]["grad_sync_dtype"] = "bf16"
    if t.low_precision:
        model.update(fp8=True, fp8_hybrid=True, fp8_params=t.fp8_params)
    if layout.zero >= 2:
        model.update(fsdp=True, fsdp_sharding_strategy=FSDP_STRATEGY[layout.zero])
        model["optim"]["name"] = "fused_adam"
    if data_path:
        model["data"] = {"data_prefix": [data_path]}
    config = {
        "trainer": {"devices": per_host, "num_nodes": hosts, "precision": PRECISION_NAMES[t.dtype]},
        "exp_manager": {"exp_dir": save_dir or f"checkpoints/{m.name}"},
        "model": model,
    }
    header = comment_safe(f"# ntp-planner plan {plan.inputs_hash[:12]}: {m.name}, {layout.describe()}") + "\n"
    header += f"# for {VERSIONS}\n"
    return Export(files={"nemo_config.yaml": header + yaml.safe_dump(config, sort_keys=False)}, warnings=warnings)
