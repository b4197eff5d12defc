"""Megatron-LM's own mapping of command-line arguments to TransformerConfig fields, for the
tests that build megatron-core's config from what ``emitters.megatron`` emits: a check with the
real library, not part of the exporter (moved here from ``emitters/megatron.py``)."""

from __future__ import annotations

import json


def transformer_config_kwargs(args: list[str]) -> dict:
    """TransformerConfig fields for emitted arguments, as Megatron-LM's
    core_transformer_config_from_args sets them (tests build megatron-core's config from this)."""
    values: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            values[args[i]] = args[i + 1]
            i += 2
        else:
            values[args[i]] = True
            i += 1
    num = lambda k, d=None: int(values[k]) if k in values else d  # noqa: E731
    kw = dict(
        num_layers=num("--num-layers"),
        hidden_size=num("--hidden-size"),
        ffn_hidden_size=num("--ffn-hidden-size"),
        num_attention_heads=num("--num-attention-heads"),
        kv_channels=num("--kv-channels"),
        num_query_groups=num("--num-query-groups"),
        tensor_model_parallel_size=num("--tensor-model-parallel-size"),
        pipeline_model_parallel_size=num("--pipeline-model-parallel-size"),
        context_parallel_size=num("--context-parallel-size", 1),
        expert_model_parallel_size=num("--expert-model-parallel-size", 1),
        sequence_parallel="--sequence-parallel" in values,
        bf16="--bf16" in values,
        fp16="--fp16" in values,
        add_bias_linear="--disable-bias-linear" not in values,
        gated_linear_unit="--swiglu" in values,
        normalization=values["--normalization"],
        attention_dropout=float(values["--attention-dropout"]),
        hidden_dropout=float(values["--hidden-dropout"]),
    )
    if "--num-virtual-stages-per-pipeline-rank" in values:
        kw["virtual_pipeline_model_parallel_size"] = num("--num-virtual-stages-per-pipeline-rank")
    for flag in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"):
        if flag in values:
            kw[flag[2:].replace("-", "_")] = True
    if "--fp8-format" in values:
        kw["fp8"] = values["--fp8-format"]
        kw["fp8_recipe"] = values.get("--fp8-recipe", "delayed")
    if "--decoder-first-pipeline-num-layers" in values:
        kw["num_layers_in_first_pipeline_stage"] = num("--decoder-first-pipeline-num-layers")
    if "--decoder-last-pipeline-num-layers" in values:
        kw["num_layers_in_last_pipeline_stage"] = num("--decoder-last-pipeline-num-layers")
    if "--pipeline-model-parallel-layout" in values:
        kw["pipeline_model_parallel_layout"] = values["--pipeline-model-parallel-layout"]
    if "--recompute-granularity" in values:
        kw["recompute_granularity"] = values["--recompute-granularity"]
        if values["--recompute-granularity"] == "full":
            kw["recompute_method"] = values["--recompute-method"]
            kw["recompute_num_layers"] = num("--recompute-num-layers")
    if "--num-experts" in values:
        kw.update(
            num_moe_experts=num("--num-experts"),
            moe_router_topk=num("--moe-router-topk"),
            moe_router_pre_softmax="--moe-router-pre-softmax" in values,
            moe_ffn_hidden_size=num("--moe-ffn-hidden-size"),
            moe_grouped_gemm="--moe-grouped-gemm" in values,
            moe_token_dispatcher_type=values["--moe-token-dispatcher-type"],
            moe_layer_freq=_freq(values["--moe-layer-freq"]),
            expert_tensor_parallel_size=num("--expert-tensor-parallel-size"),
            moe_shared_expert_intermediate_size=num("--moe-shared-expert-intermediate-size"),
            overlap_moe_expert_parallel_comm="--overlap-moe-expert-parallel-comm" in values,
        )
        if "--moe-flex-dispatcher-backend" in values:
            kw["moe_flex_dispatcher_backend"] = values["--moe-flex-dispatcher-backend"]
    if "--multi-latent-attention" in values:  # Megatron-LM then builds an MLATransformerConfig
        kw.update(
            multi_latent_attention=True,
            q_lora_rank=num("--q-lora-rank"),
            kv_lora_rank=num("--kv-lora-rank"),
            qk_head_dim=num("--qk-head-dim"),
            qk_pos_emb_head_dim=num("--qk-pos-emb-head-dim"),
            v_head_dim=num("--v-head-dim"),
        )
        if "--q-lora-rank" not in values:  # argparse's default; the config class defaults to 512
            kw["q_lora_rank"] = None
    kw["mtp_num_layers"] = num("--mtp-num-layers")
    if "--window-size" in values:  # Megatron-LM's tuple_type: "a,b" -> (a, b)
        kw["window_size"] = tuple(int(x) for x in values["--window-size"].strip("()").split(","))
        kw["window_attn_skip_freq"] = (
            _freq(values["--window-attn-skip-freq"]) if "--window-attn-skip-freq" in values else None
        )
    if "--softmax-type" in values:
        kw["softmax_type"] = values["--softmax-type"]
    # the model's own settings (Megatron-LM: --norm-epsilon -> layernorm_epsilon, and so on)
    if "--norm-epsilon" in values:
        kw["layernorm_epsilon"] = float(values["--norm-epsilon"])
    kw["add_qkv_bias"] = "--add-qkv-bias" in values
    if "--moe-aux-loss-coeff" in values:
        kw["moe_aux_loss_coeff"] = float(values["--moe-aux-loss-coeff"])
    if "--moe-router-score-function" in values:
        kw["moe_router_score_function"] = values["--moe-router-score-function"]
    if "--moe-router-enable-expert-bias" in values:
        kw["moe_router_enable_expert_bias"] = True
    kw["qk_l2_norm"] = "--qk-l2-norm" in values
    kw["layernorm_zero_centered_gamma"] = "--apply-layernorm-1p" in values
    return {k: v for k, v in kw.items() if v is not None or k == "q_lora_rank"}


def _freq(text: str) -> int | list[int]:
    """Megatron-LM's moe_freq_type for what the exporter writes: an int, or a list literal."""
    return json.loads(text) if str(text).startswith("[") else int(text)


def transformer_config(args: list[str], **extra):
    """megatron-core's own config from emitted arguments: MLATransformerConfig when they ask
    for multi-head latent attention (as Megatron-LM's core_transformer_config_from_args does),
    else TransformerConfig; ``extra`` fields added (``pipeline_dtype``)."""
    import warnings

    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kwargs = transformer_config_kwargs(args)
    cls = MLATransformerConfig if kwargs.get("multi_latent_attention") else TransformerConfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kwargs, **extra)
