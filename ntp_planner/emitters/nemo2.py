"""NeMo 2.x: a Python recipe that sets MegatronStrategy and the data module's batch sizes, for
the nemo-toolkit releases that have ``nemo.collections.llm`` (2.0 to 2.7); 3.0 removed it and
trains LLMs with Megatron-Bridge's recipes (``emitters.bridge``)."""

from __future__ import annotations

from ntp_planner.emitters.common import (
    Export,
    comment_safe,
    expressible_layout,
    launch_geometry,
    low_precision_fields,
    mcore_fields,
    sharding_fields,
    sharding_warnings,
)
from ntp_planner.emitters.moe import MLA_NOTE, moe_warnings, yarn_notes
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult

VERSIONS = "NeMo 2.x (nemo-toolkit 2.0 to 2.7, which have nemo.collections.llm); NeMo 3: --format bridge"
# NeMo 2.0 recipe modules for catalogue models (llm.<module>.pretrain_recipe); GPT-OSS has only
# finetune_recipe in 2.7
RECIPES = {
    "llama3-8b": "llama3_8b",
    "llama3-70b": "llama3_70b",
    "llama3.1-405b": "llama31_405b",
    "mixtral-8x7b": "mixtral_8x7b",
    "mixtral-8x22b": "mixtral_8x22b",
    "deepseek-v3": "deepseek_v3",
    "qwen3-30b-a3b": "qwen3_30b_a3b",
    "gpt3-175b": "gpt3_175b",
    "nemotron-8b": "nemotron3_8b",
    "nemotron-22b": "nemotron3_22b",
    "nemotron4-15b": "nemotron4_15b",
    "nemotron-340b": "nemotron4_340b",
}
# the MLP activations a recipe must bring (a callable in its model config, which the export does not set)
ACTIVATION_NAMES = {"quick_gelu": "GPT-OSS's clamped, offset quick-GELU gate", "squared_relu": "a squared-ReLU MLP"}
STRATEGY_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
)
# the recipes' own pipeline settings (llm.mixtral_8x7b sets vpp 8): a plan without them clears them
STRATEGY_CLEARED = {
    "virtual_pipeline_model_parallel_size": None,
    "num_layers_in_first_pipeline_stage": None,
    "num_layers_in_last_pipeline_stage": None,
}
MODEL_FIELDS = (  # set on the model's TransformerConfig
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
    # experts and attention variants (emitters.moe), on the recipe's model config
    "num_moe_experts",
    "moe_router_topk",
    "moe_router_pre_softmax",
    "moe_ffn_hidden_size",
    "moe_grouped_gemm",
    "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend",
    "overlap_moe_expert_parallel_comm",
    "moe_layer_freq",
    "moe_shared_expert_intermediate_size",
    "moe_shared_expert_overlap",
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "mtp_num_layers",
    "window_size",
    "window_attn_skip_freq",
    "softmax_type",
    # the model as its authors wrote it (emitters.moe.model_fields): GPTConfig's rotary_base and
    # TransformerConfig's fields; Llama 3.1's scaling lives in its own config class (Llama31Config)
    "rotary_base",
    "layernorm_epsilon",
    "qk_layernorm",
    "glu_linear_offset",
    "activation_func_clamp_value",
    "add_qkv_bias",
    "moe_aux_loss_coeff",
    "moe_router_score_function",
    "moe_router_enable_expert_bias",
    "apply_rope_fusion",  # set only when the plan runs RoPE unfused (TrainingSpec.rope_fusion: YaRN)
    # YaRN (emitters.moe.yarn_fields): GPTOSSConfig's position type and yarn_* fields (its mscale pair defaults
    # to 1, 1, not HF's rule, so both are set), DeepSeekV3Config's (MLATransformerConfig's) unprefixed ones
    "position_embedding_type",
    "yarn_rotary_scaling_factor",
    "yarn_original_max_position_embeddings",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "yarn_correction_range_round_to_int",
    "yarn_mscale",
    "yarn_mscale_all_dim",
    "rope_type",
    "rotary_scaling_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
)
YARN_NOTE = (
    "NeMo 2.0: {name}'s YaRN fields (yarn_*) exist on llm.GPTOSSConfig's model config only (GPTConfig lacks them): "
    "configure() a recipe whose model config is a GPTOSSConfig"
)


def emit(
    plan: Plan, replan: ReplanResult | None = None, data_path: str | None = None, save_dir: str | None = None
) -> Export:
    layout, warnings = expressible_layout(plan, "NeMo 2.0")
    warnings += sharding_warnings(layout, "NeMo 2.0") + moe_warnings(plan, layout, "NeMo 2.0")
    if plan.model.is_mla and RECIPES.get(plan.model.name) != "deepseek_v3":
        warnings.append(MLA_NOTE.format(target="NeMo 2.0", config="an MLA model config (llm.DeepSeekV3Config)"))
    warnings += _model_notes(plan) + yarn_notes(plan.model, "NeMo 2.0")
    if plan.model.yarn is not None and not plan.model.is_mla:
        warnings.append(YARN_NOTE.format(name=plan.model.name))
    hosts, per_host = launch_geometry(plan)
    fields = _fields(plan, layout)
    lines = [f"    strategy.{k} = {fields[k]!r}" for k in STRATEGY_FIELDS if k in fields]
    lines += [f"    recipe.model.config.{k} = {fields[k]!r}" for k in MODEL_FIELDS if k in fields]
    ddp = sharding_fields(layout)
    if ddp.pop("use_megatron_fsdp", False):
        lines.append('    strategy.fsdp = "megatron"')
    lines += [f"    strategy.ddp.{k} = {v!r}" for k, v in ddp.items()]
    lines.append(f"    recipe.trainer.plugins.grad_reduce_in_fp32 = {plan.training.grad_bytes == 4!r}")
    lines += [f"    recipe.trainer.plugins.{k} = {v!r}" for k, v in low_precision_fields(plan).items()]
    if plan.training.fp8_attention:  # MegatronMixedPrecision passes it to the model's TransformerConfig
        lines.append("    recipe.trainer.plugins.fp8_dot_product_attention = True")
    strategy = "\n".join(lines)
    # the model config is built (and checked) before the strategy copies its parallelism into it:
    # it gets the same sizes, which its checks (pipeline dtype, MoE overlap, dispatcher) read
    copied = [k for k in STRATEGY_FIELDS if k in fields] + ["pipeline_dtype"]
    config = "".join(f"    recipe.model.config.{k} = strategy.{k}\n" for k in copied)
    recipe = RECIPES.get(plan.model.name)
    dtype = "torch.float16" if plan.training.dtype == "fp16" else "torch.bfloat16"
    make = (
        f"llm.{recipe}.pretrain_recipe(num_nodes={hosts}, num_gpus_per_node={per_host})"
        if recipe
        else f"None  # no NeMo recipe is known for {plan.model.name!r}: pass yours to configure()"
    )
    data = _data_and_checkpoint_lines(data_path, save_dir)
    imports = "import nemo_run as run\n" if data_path else ""
    title = comment_safe(f"{plan.model.name}, {layout.describe()}").replace("\\", "/").replace('"', "'")
    text = f'''"""NeMo 2.0 recipe settings from ntp-planner plan {plan.inputs_hash[:12]}: {title}.

For {VERSIONS}.
"""

import torch
{imports}from nemo.collections import llm


def configure(recipe):
    """Apply the plan's parallelism and batch sizes to a NeMo 2.0 pretraining recipe."""
    recipe.trainer.num_nodes = {hosts}
    recipe.trainer.devices = {per_host}
    strategy = recipe.trainer.strategy
{strategy}
    strategy.pipeline_dtype = {dtype}
{config}{data}    recipe.data.micro_batch_size = {layout.micro_batch}
    recipe.data.global_batch_size = {layout.global_batch}
    recipe.data.seq_length = {plan.training.seq_len}
    return recipe


if __name__ == "__main__":
    recipe = {make}
    if recipe is not None:
        configure(recipe)
'''
    return Export(files={"nemo2_recipe.py": text}, warnings=warnings)


def _fields(plan: Plan, layout) -> dict:
    """megatron-core field values for the recipe, with what NeMo's recipes set of their own undone."""
    fields = STRATEGY_CLEARED | mcore_fields(plan, layout)
    if fields.get("pipeline_model_parallel_layout") and layout.vpp > 1:
        # NeMo copies the strategy's vpp (None otherwise) over the one the layout implies, and
        # megatron-core's EP overlap check then finds none
        fields["virtual_pipeline_model_parallel_size"] = layout.vpp
    if fields.get("moe_token_dispatcher_type", "alltoall") != "alltoall":
        # megatron-core overlaps the shared experts with the alltoall dispatcher only, and
        # llm.deepseek_v3's config turns that overlap on: with another dispatcher it refuses the config
        fields["moe_shared_expert_overlap"] = False
    return fields


def _model_notes(plan: Plan) -> list[str]:
    """An activation the export cannot set (a callable) on a model without a NeMo recipe of its own."""
    m = plan.model
    kind = m.gate_activation if m.gated_mlp else m.mlp_activation
    if kind not in ACTIVATION_NAMES or m.name in RECIPES:
        return []
    return [
        f"NeMo 2.0: the export sets no activation function (a callable in the recipe's model config), and "
        f"{m.name} has {ACTIVATION_NAMES[kind]}: configure() a recipe whose model config has it"
    ]


def _data_and_checkpoint_lines(data_path: str | None, save_dir: str | None) -> str:
    """Recipe lines for ``--data-path`` (the recipe's mock data module replaced by NeMo's
    PreTrainingDataModule over that path, keeping the recipe's tokenizer) and ``--save-dir``
    (NeMoLogger's log_dir, under which NeMo writes the checkpoints); values as Python literals."""
    lines = []
    if data_path:
        lines.append(
            f"    recipe.data = run.Config(llm.PreTrainingDataModule, paths=[{data_path!r}], "
            "tokenizer=recipe.data.tokenizer)"
        )
    if save_dir:
        lines.append(f"    recipe.log.log_dir = {save_dir!r}")
    return "".join(line + "\n" for line in lines)
