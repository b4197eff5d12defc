"""Megatron-Bridge: a YAML override with model.*, train.*, dataset.* and ddp.* sections."""

from __future__ import annotations

import yaml

from ntp_planner.emitters.common import (
    Export,
    comment_safe,
    expressible_layout,
    mcore_fields,
    sharding_fields,
    sharding_warnings,
)
from ntp_planner.emitters.moe import FP8_ATTENTION_NOTE, MLA_NOTE, moe_warnings, position_type, yarn_notes
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult

# The Megatron-Bridge 0.3.1 recipe each catalogue model starts from (megatron.bridge.recipes.<name>):
# the override replaces its model shape and parallelism; a model without one starts from another
# recipe of the same architecture, named in a warning.
RECIPES = {
    "llama2-7b": "llama.llama2_7b_pretrain_config",
    "llama3-8b": "llama.llama3_8b_pretrain_config",
    "llama3-70b": "llama.llama3_70b_pretrain_config",
    "llama3.1-405b": "llama.llama31_405b_pretrain_config",
    "qwen3-30b-a3b": "qwen.qwen3_30b_a3b_pretrain_config",
    "qwen3-235b-a22b": "qwen.qwen3_235b_a22b_pretrain_config",
    "deepseek-v3": "deepseek.deepseek_v3_pretrain_config",
    "gpt-oss-20b": "gpt_oss.gpt_oss_20b_pretrain_config",
    "gpt-oss-120b": "gpt_oss.gpt_oss_120b_pretrain_config",
}
VERSIONS = "Megatron-Bridge 0.3 recipes, which NeMo 3 (nemo-toolkit 3.0) trains LLMs with"
# The recipe a model without one of its own starts from: one whose MLP is gated as the model's is.
# Bridge puts the recipe's callables (activation_func) back after merging an override, so the
# activation comes from the recipe whatever the YAML says; the override sets the rest of the model.
BASES = {
    "quick_gelu": "gpt_oss.gpt_oss_20b_pretrain_config",  # GPT-OSS's clamped, offset quick-GELU gate (experts)
    "moe": "qwen.qwen3_30b_a3b_pretrain_config",  # SwiGLU experts
    "silu": "llama.llama3_8b_pretrain_config",  # SwiGLU
    "gelu": "gemma.gemma2_9b_pretrain_config",  # GeGLU (Gemma2ModelProvider's fast_gelu)
    "plain": "gpt.gpt3_175b.gpt3_175b_pretrain_config",  # a 2-matrix GELU MLP (GPTProvider175B)
}

# Bridge's mixed-precision recipe by plan format (a name: a section of fields would replace the
# recipe's resolved config with a plain dict, and bf16 with it), with what it does that a plan may
# not: (gathers fp8/fp4 weights, reduces gradients in fp32, keeps the first and last layer in bf16)
PRECISION_RECIPES = {
    ("bf16", None): ("bf16_mixed", False, True, False),
    ("fp16", None): ("fp16_mixed", False, False, False),
    ("fp8", "delayed"): ("bf16_with_fp8_delayed_scaling_mixed", True, True, False),
    ("fp8", "current"): ("bf16_with_fp8_current_scaling_mixed", True, True, True),
    ("mxfp8", None): ("bf16_with_mxfp8_mixed", True, True, False),
    ("nvfp4", None): ("bf16_with_nvfp4_mixed", False, True, False),
}


# megatron-core's ways of placing layers on stages: any the plan does not set is cleared
PIPELINE_KEYS = (
    "virtual_pipeline_model_parallel_size",
    "pipeline_model_parallel_layout",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
)


def recipe_of(plan: Plan) -> tuple[str, list[str]]:
    """The Bridge recipe to start from, and a warning when the model has none of its own."""
    name = plan.model.name
    if name in RECIPES:
        return RECIPES[name], []
    m = plan.model
    gate = m.gate_activation if m.gated_mlp else "plain"
    base = BASES["quick_gelu" if gate == "quick_gelu" else "moe" if m.is_moe else gate]
    notes = [
        f"Megatron-Bridge 0.3.1 has no recipe for {name!r}; apply this override to {base}, whose MLP is gated as "
        "this model's (the override sets the rest of the model, QK layernorm included)"
    ]
    if not m.gated_mlp and m.mlp_activation == "squared_relu":
        notes.append(
            f"Megatron-Bridge 0.3.1 has no recipe with {name}'s squared-ReLU MLP and puts the recipe's activation "
            "back over an override, so the model built gets GELU: start from a NemotronModelProvider "
            "(megatron.bridge.models.nemotron) to train it as written"
        )
    return base, notes


def precision_of(plan: Plan) -> tuple[str, list[str]]:
    """Bridge's mixed-precision recipe for the plan's format, and where it differs from the plan."""
    t = plan.training
    recipe, gathers, fp32_grads, bf16_ends = PRECISION_RECIPES[(t.dtype, t.fp8_recipe if t.dtype == "fp8" else None)]
    warnings = []
    if t.low_precision and gathers != bool(t.fp8_params):
        how = "gathers" if gathers else "does not gather"
        warnings.append(f"Megatron-Bridge's {recipe} {how} the weights in the low-precision format, unlike the plan")
    if fp32_grads != (t.grad_bytes == 4):
        warnings.append(
            f"Megatron-Bridge's {recipe} reduces gradients in {'fp32' if fp32_grads else '16 bits'}, "
            f"unlike the plan ({int(8 * t.grad_bytes)}-bit gradients): memory and step time differ"
        )
    if bf16_ends:
        warnings.append(f"Megatron-Bridge's {recipe} keeps the first and last layer in bf16, unlike the plan")
    return recipe, warnings


# GPT-3 175B's recipe overlaps TP communication through userbuffers tuned for its own shape (hidden
# 12288 at TP 4) and defers the embedding's weight gradient (which needs APEX's fused gradient
# accumulation): for another model on that recipe both are turned off
GPT3_OVERLAP_OFF = {"tp_comm_overlap": False, "tp_comm_overlap_cfg": None, "defer_embedding_wgrad_compute": False}
GPT3_OVERLAP_NOTE = (
    "Megatron-Bridge: the TP communication overlap is turned off (GPT-3 175B's recipe tunes its userbuffers for "
    "that model's shape); set comm_overlap.tp_comm_overlap_cfg for this model to overlap as planned"
)


def structure_fields(m) -> dict:
    """What a recipe's provider may hold otherwise (another model's recipe): the MLP's gating, the
    biases, the norm and whether it scales by (1 + w) (Gemma's recipes do), the positions and the
    share of each head they turn, Llama 4's L2 query/key norm and the tied output layer
    (TransformerConfig / GPTModelProvider)."""
    fused = {} if m.bias or m.gated_mlp else {"bias_activation_fusion": False}  # megatron-core: GELU's fuses a bias
    return fused | {
        "gated_linear_unit": m.gated_mlp,
        "add_bias_linear": m.bias,
        "normalization": "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
        "layernorm_zero_centered_gamma": m.norm_zero_centered,
        "position_embedding_type": position_type(m),
        "rotary_percent": m.rotary_fraction,
        "qk_l2_norm": m.qk_l2_norm,
        "share_embeddings_and_output_weights": m.tie_embeddings,
    }


# Bridge 0.3.1 builds Llama 4's L2 query/key norm only through Llama4ModelProvider's layer spec
# (llama4_utils.get_llama4_layer_spec, no recipe); the recipes' GPT specs read qk_layernorm alone
L2_NOTE = (
    "Megatron-Bridge 0.3.1 builds {name}'s L2 query/key norm (qk_l2_norm) only with Llama4ModelProvider's layer "
    "spec, and {recipe}'s spec ignores the field: build the model with Llama4Experts16ModelProvider to train it "
    "as written"
)
WHOLE_QK_NOTE = (
    "Megatron-Bridge 0.3.1 has no query/key norms over the whole projections ({name}'s, OLMo 2 style; megatron-core's "
    "qk_layernorm norms each head): the model it builds lacks them"
)


# Bridge 0.3.1's recipes whose provider declares megatron-core's yarn_* fields (GPTOSSProvider); another
# recipe's provider drops them from the overrides unread, and megatron-core then fails to build a 'yarn' model
YARN_RECIPES = ("gpt_oss.",)
YARN_NOTE = (
    "Megatron-Bridge 0.3.1: {recipe}'s provider has no YaRN fields (yarn_*; GPTOSSProvider has them), so {name} "
    "is exported with plain rotary positions: its YaRN scaling (factor {factor}) is not applied"
)


def without_yarn(model: dict, m, recipe: str) -> list[str]:
    """Drop a GPT model's YaRN from ``model`` (the overrides) where the recipe's provider cannot take
    it, and say so; MLA providers (DeepSeek-V3's) declare their own YaRN fields."""
    if m.yarn is None or m.is_mla or recipe.startswith(YARN_RECIPES):
        return []
    for key in [k for k in model if k.startswith("yarn_")]:
        model.pop(key)
    model["position_embedding_type"] = "rope"
    return [YARN_NOTE.format(recipe=recipe, name=m.name, factor=m.yarn.factor)]


def model_notes(m, recipe: str) -> list[str]:
    """What the recipe's provider cannot build of ``m``: Llama 4's L2 query/key norm outside its own
    provider, query/key norms over the whole projections."""
    notes = [L2_NOTE.format(name=m.name, recipe=recipe)] if m.qk_l2_norm else []
    if m.qk_norm and m.qk_norm_span == "projection":
        notes.append(WHOLE_QK_NOTE.format(name=m.name))
    return notes


def emit(
    plan: Plan, replan: ReplanResult | None = None, data_path: str | None = None, save_dir: str | None = None
) -> Export:
    layout, warnings = expressible_layout(plan, "Megatron-Bridge")
    warnings += sharding_warnings(layout, "Megatron-Bridge")
    warnings += moe_warnings(plan, layout, "Megatron-Bridge")
    if plan.model.is_mla:
        provider = "an MLA model provider (DeepSeekV3ModelProvider)"
        warnings.append(MLA_NOTE.format(target="Megatron-Bridge", config=provider))
    recipe, notes = recipe_of(plan)
    precision, differs = precision_of(plan)
    warnings += notes + differs + model_notes(plan.model, recipe) + yarn_notes(plan.model, "Megatron-Bridge")
    if plan.training.fp8_attention:
        why = f"Bridge's {precision} recipe sets fp8_dot_product_attention false over the model's"
        how = "on the resolved mixed_precision config (cfg.mixed_precision.fp8_dot_product_attention = True)"
        warnings.append(FP8_ATTENTION_NOTE.format(target="Megatron-Bridge", why=why, how=how))
    model = {k: list(v) if isinstance(v, tuple) else v for k, v in mcore_fields(plan, layout).items() if v is not None}
    model["seq_length"] = plan.training.seq_len  # Bridge asserts it equals dataset.seq_length
    model["vocab_size"] = plan.model.vocab_size  # another model's recipe reads its own from its config.json
    m, seq = plan.model, plan.training.seq_len
    if m.position == "learned" and m.max_position_embeddings != seq:
        warnings.append(
            f"Megatron-Bridge's GPT provider sizes learned position embeddings by seq_length ({seq}), not by the "
            f"model's {m.max_position_embeddings} positions: its checkpoints hold {seq} rows"
        )
    model |= structure_fields(plan.model)
    warnings += without_yarn(model, plan.model, recipe)
    if notes:  # another model's recipe: its QK layernorm (Qwen3's) is this model's only if it has one
        model["qk_layernorm"] = model.get("qk_layernorm", False)
    for key in PIPELINE_KEYS:  # the recipe's own split (DeepSeek-V3's layout string) would clash with the plan's
        model.setdefault(key, False if key.startswith("account_for") else None)
    ddp = sharding_fields(layout)
    fsdp = bool(ddp.get("use_megatron_fsdp"))
    config = {
        "model": model,
        "train": {"global_batch_size": layout.global_batch, "micro_batch_size": layout.micro_batch},
        "dataset": {"seq_length": plan.training.seq_len, **({"data_path": data_path} if data_path else {})},
        "ddp": ddp,
        "mixed_precision": precision,  # the recipe's name: Bridge resolves it and sets the dtypes
        **({"dist": {"use_megatron_fsdp": True}} if fsdp else {}),
        "checkpoint": {
            "save": save_dir or f"checkpoints/{plan.model.name}",
            **({"ckpt_format": "fsdp_dtensor"} if fsdp else {}),  # the only format Megatron-FSDP saves
        },
    }
    if recipe == BASES["plain"]:
        config["comm_overlap"] = GPT3_OVERLAP_OFF
        if layout.tp_comm_overlap:
            warnings.append(GPT3_OVERLAP_NOTE)
    header = (
        comment_safe(f"# ntp-planner plan {plan.inputs_hash[:12]}: {plan.model.name}, {layout.describe()}")
        + f"\n# for {VERSIONS}\n# apply to megatron.bridge.recipes.{recipe}() with process_config_with_overrides\n"
    )
    return Export(files={"bridge_override.yaml": header + yaml.safe_dump(config, sort_keys=False)}, warnings=warnings)
