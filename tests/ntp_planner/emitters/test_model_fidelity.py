"""The model as its authors wrote it in every export (issue 25 item 2): GPT-OSS's clamped, offset
quick-GELU gate, Qwen3's per-head QK norms, Nemotron's squared ReLU, fp8 attention, and what
Megatron-LM's command line cannot build of Gemma 2 (its post-norms and logit soft-capping), said
in a warning. The framework loaders (tests/support/*_loader.py, ``make test-slow``) read the same
exports with the frameworks' own code; these pin the exported words."""

from __future__ import annotations

import json

import pytest
import yaml

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.hf_config import model_from_hf_config
from ntp_planner.emitters import export
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster

MOE = dict(tp=2, pp=1, dp=4, ep=4, etp=1, global_batch=8, sequence_parallel=True, distributed_optimizer=True)
DENSE = dict(tp=2, pp=1, dp=4, global_batch=8, sequence_parallel=True, distributed_optimizer=True)


def _plan(model, training=None, **layout):
    m = MODELS[model] if isinstance(model, str) else model
    lay = ParallelLayout(**(layout or (MOE if m.is_moe else DENSE)))
    t = training or TrainingSpec(seq_len=4096, global_batch=lay.global_batch)
    return plan_from_layout(m, t, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=lay.world_size), lay)


def _args(plan) -> list[str]:
    return json.loads(export(plan, "megatron").files["megatron_args.json"])


def _value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_gpt_oss_is_exported_with_its_clamped_offset_quick_gelu_gate():
    """Megatron-LM 0.19.2: --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7 (what
    Megatron-Bridge's GPTOSSProvider sets: quick_gelu, glu_linear_offset 1.0, clamp 7.0), not --swiglu."""
    plan = _plan("gpt-oss-20b")
    args = _args(plan)
    assert "--quick-geglu" in args and "--swiglu" not in args
    assert (_value(args, "--glu-linear-offset"), _value(args, "--activation-func-clamp-value")) == ("1", "7")
    bridge = yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])["model"]
    assert (bridge["glu_linear_offset"], bridge["activation_func_clamp_value"]) == (1, 7)
    recipe = export(plan, "nemo2")
    assert "recipe.model.config.glu_linear_offset = 1" in recipe.files["nemo2_recipe.py"]
    assert "recipe.model.config.activation_func_clamp_value = 7" in recipe.files["nemo2_recipe.py"]
    # nemo-toolkit 2.7's gpt_oss_20b has a finetune_recipe only: no recipe to bring the gate, and the export says so
    assert "no NeMo recipe is known for 'gpt-oss-20b'" in recipe.files["nemo2_recipe.py"]
    assert any("clamped, offset quick-GELU gate" in w for w in recipe.warnings)
    renamed = _plan(MODELS["gpt-oss-20b"].model_copy(update={"name": "my-oss"}))  # no recipe: the export says so
    assert any("clamped, offset quick-GELU gate" in w for w in export(renamed, "nemo2").warnings)
    nemo = export(plan, "nemo")
    assert yaml.safe_load(nemo.files["nemo_config.yaml"])["model"]["activation"] == "fast-geglu"
    assert any("glu_linear_offset dropped" in w for w in nemo.warnings)
    assert any("no quick-GELU gate" in w for w in nemo.warnings)
    llama = _args(_plan("llama3-8b"))  # SwiGLU: neither offset nor clamp
    assert "--swiglu" in llama and "--glu-linear-offset" not in llama and "--activation-func-clamp-value" not in llama


def test_a_gpt_oss_config_json_without_a_recipe_starts_from_gpt_oss_recipe():
    from ntp_planner.emitters.bridge import recipe_of

    m = MODELS["gpt-oss-20b"].model_copy(update={"name": "my-oss"})
    assert recipe_of(_plan(m))[0] == "gpt_oss.gpt_oss_20b_pretrain_config"


def test_qwen3_normalises_queries_and_keys_in_every_target():
    plan = _plan("qwen3-30b-a3b")
    assert "--qk-layernorm" in _args(plan)
    assert yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])["model"]["qk_layernorm"] is True
    assert "recipe.model.config.qk_layernorm = True" in export(plan, "nemo2").files["nemo2_recipe.py"]
    assert yaml.safe_load(export(plan, "nemo").files["nemo_config.yaml"])["model"]["qk_layernorm"] is True
    mixtral = _plan("mixtral-8x7b")  # no QK norm: none asked, and Qwen3's recipe's turned off for Bridge
    assert "--qk-layernorm" not in _args(mixtral)
    assert yaml.safe_load(export(mixtral, "bridge").files["bridge_override.yaml"])["model"]["qk_layernorm"] is False


def test_nemotron_is_exported_with_its_squared_relu():
    plan = _plan("nemotron4-15b")
    args = _args(plan)
    assert "--squared-relu" in args and "--swiglu" not in args and "--quick-geglu" not in args
    assert yaml.safe_load(export(plan, "nemo").files["nemo_config.yaml"])["model"]["activation"] == "squared-relu"
    assert "llm.nemotron4_15b.pretrain_recipe" in export(plan, "nemo2").files["nemo2_recipe.py"]
    assert any("squared-ReLU MLP" in w and "GELU" in w for w in export(plan, "bridge").warnings)
    gpt = _plan("gpt3-5b", TrainingSpec(seq_len=2048, global_batch=8), **DENSE)
    assert "--squared-relu" not in _args(gpt)  # GPT's plain GELU MLP


def test_fp8_attention_reaches_nemo2_and_the_others_say_they_cannot_carry_it():
    t = TrainingSpec(seq_len=4096, global_batch=8, dtype="fp8", fp8_recipe="current", fp8_attention=True)
    plan = _plan("llama3-8b", training=t, **DENSE)
    assert "recipe.trainer.plugins.fp8_dot_product_attention = True" in export(plan, "nemo2").files["nemo2_recipe.py"]
    said = {fmt: [w for w in export(plan, fmt).warnings if "fp8 attention" in w] for fmt in ("megatron", "bridge",
                                                                                             "torchtitan")}  # fmt: skip
    assert all(len(ws) == 1 for ws in said.values()), said
    assert "has no flag for it" in said["megatron"][0] and "fp8_dot_product_attention" in said["megatron"][0]
    assert "--fp8-dot-product-attention" not in _args(plan)  # not a Megatron-LM 0.19.2 flag
    assert "cfg.mixed_precision.fp8_dot_product_attention = True" in said["bridge"][0]
    plain = _plan("llama3-8b", training=t.model_copy(update={"fp8_attention": False}), **DENSE)
    assert not any("fp8 attention" in w for fmt in ("megatron", "bridge", "torchtitan")
                   for w in export(plain, fmt).warnings)  # fmt: skip
    assert "fp8_dot_product_attention" not in export(plain, "nemo2").files["nemo2_recipe.py"]


GEMMA2 = {
    "model_type": "gemma2", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 4096,
    "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 512, "max_position_embeddings": 8192,
}  # fmt: skip


def test_megatron_says_what_gemma2_loses_on_its_command_line():
    gemma2 = model_from_hf_config(GEMMA2, "gemma2-tiny")
    assert (gemma2.post_norms, gemma2.attention_softcap, gemma2.final_softcap) == (True, 50.0, 30.0)
    said = [w for w in export(_plan(gemma2), "megatron").warnings if "lacks" in w]
    assert said == [
        "Megatron-LM's command line has no norms after attention and after the MLP nor attention logit soft-capping "
        "nor output logit soft-capping, so the model it builds from this export lacks gemma2-tiny's post-attention "
        "and post-MLP norms, attention soft-cap 50.0, output soft-cap 30.0: add them in pretrain_gpt.py's model "
        "provider to train the model exactly as written"
    ]
    uncapped = model_from_hf_config({**GEMMA2, "attn_logit_softcapping": None, "final_logit_softcapping": None}, "g")
    assert (uncapped.attention_softcap, uncapped.final_softcap) == (None, None)
    assert [w for w in export(_plan(uncapped), "megatron").warnings if "lacks" in w][0].count("soft") == 0
    assert not any("lacks" in w for w in export(_plan("llama3-8b"), "megatron").warnings)


@pytest.mark.parametrize(("name", "extra"), [("qwen3-30b-a3b", 48 * 2 * 128), ("gpt-oss-20b", 0)])
def test_the_catalogue_counts_qk_norms(name, extra):
    m = MODELS[name]
    assert m.params_total - m.model_copy(update={"qk_norm": False}).params_total == extra


def test_nemotron_keeps_its_layernorm1p_and_half_rotary_in_every_target():
    """NeMo's and Bridge's Nemotron: LayerNorm1P (layernorm_zero_centered_gamma) and rotary positions on
    half of each head; Megatron-LM 0.19.2 spells them --apply-layernorm-1p and --rotary-percent, NeMo 1.x
    normalization layernorm1p and rotary_percentage."""
    plan = _plan("nemotron4-15b")
    args = _args(plan)
    assert "--apply-layernorm-1p" in args and _value(args, "--rotary-percent") == "0.5"
    bridge = yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])["model"]
    assert (bridge["layernorm_zero_centered_gamma"], bridge["rotary_percent"]) == (True, 0.5)
    nemo = yaml.safe_load(export(plan, "nemo").files["nemo_config.yaml"])["model"]
    assert (nemo["normalization"], nemo["rotary_percentage"]) == ("layernorm1p", 0.5) and "rotary_percent" not in nemo
    llama = _plan("llama3-8b")  # neither: and a recipe's own (Gemma's zero-centred norms) is turned off for Bridge
    assert "--apply-layernorm-1p" not in _args(llama) and "--rotary-percent" not in _args(llama)
    bridge = yaml.safe_load(export(llama, "bridge").files["bridge_override.yaml"])["model"]
    assert (bridge["layernorm_zero_centered_gamma"], bridge["rotary_percent"]) == (False, 1.0)
    gemma2 = _args(_plan(model_from_hf_config(GEMMA2, "gemma2-tiny")))  # Gemma's RMSNorm scales by (1 + w)
    assert "--apply-layernorm-1p" in gemma2 and _value(gemma2, "--normalization") == "RMSNorm"


def test_llama4_scout_l2_normalises_queries_and_keys_where_a_target_can():
    """Megatron-LM: --qk-l2-norm (pretrain_gpt.py hands it to the layer spec, megatron-core's L2Norm);
    Bridge has the field but builds the norm only through Llama4ModelProvider's spec, and says so;
    NeMo 1.x has none. Maverick does not normalise (use_qk_norm false). Both skip rotary positions on
    every 4th layer (--no-rope-freq 4), where Scout skips its L2 norm too, which Megatron's spec does not."""
    plan = _plan("llama4-scout")
    args = _args(plan)
    assert "--qk-l2-norm" in args and "--qk-layernorm" not in args and _value(args, "--no-rope-freq") == "4"
    assert [w for w in export(plan, "megatron").warnings if "--qk-l2-norm" in w] == [
        "Megatron-LM's command line L2-normalises queries and keys in every layer (--qk-l2-norm), llama4-scout only "
        "in its layers with rotary positions (not each 4th): give the NoPE layers' attention no L2 norm in "
        "pretrain_gpt.py's model provider to train the model exactly as written"
    ]
    bridge = export(plan, "bridge")
    model = yaml.safe_load(bridge.files["bridge_override.yaml"])["model"]
    assert (model["qk_l2_norm"], model["no_rope_freq"]) == (True, 4)
    assert [w for w in bridge.warnings if "qk_l2_norm" in w] == [
        "Megatron-Bridge 0.3.1 builds llama4-scout's L2 query/key norm (qk_l2_norm) only with Llama4ModelProvider's "
        "layer spec, and qwen.qwen3_30b_a3b_pretrain_config's spec ignores the field: build the model with "
        "Llama4Experts16ModelProvider to train it as written"
    ]
    nemo = export(plan, "nemo")
    assert "qk_l2_norm" not in yaml.safe_load(nemo.files["nemo_config.yaml"])["model"]
    assert any(w.startswith("NeMo: qk_l2_norm dropped") for w in nemo.warnings)
    assert any(w.startswith("NeMo: no_rope_freq dropped") for w in nemo.warnings)
    maverick = _plan("llama4-maverick")
    assert "--qk-l2-norm" not in _args(maverick) and _value(_args(maverick), "--no-rope-freq") == "4"
    assert not any("--qk-l2-norm" in w for w in export(maverick, "megatron").warnings)
    assert "--no-rope-freq" not in _args(_plan("llama3-8b"))
    assert not any("qk_l2_norm" in w for w in export(maverick, "bridge").warnings)


OLMO2 = {
    "model_type": "olmo2", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096, "rms_norm_eps": 1e-6,
}  # fmt: skip


def test_olmo2_whole_projection_qk_norms_are_counted_and_said_lost_where_no_target_builds_them():
    """OLMo 2 normalises the whole query projection (8 x 128 = 1024 wide) and key projection (4 x 128 =
    512): 1536 weights a layer in ntp's count; megatron-core's qk_layernorm would build per-head norms
    of 128 instead, so no export asks for it, and Megatron-LM's and Bridge's say what is lost."""
    olmo = model_from_hf_config(OLMO2, "olmo2-tiny")
    assert olmo.qk_norm_params == 1536
    assert olmo.params_total - olmo.model_copy(update={"qk_norm": False, "qk_norm_span": "head"}).params_total == 6144
    plan = _plan(olmo)
    assert "--qk-layernorm" not in _args(plan)
    assert [w for w in export(plan, "megatron").warnings if "lacks" in w] == [
        "Megatron-LM's command line has no query/key norms over whole projections, so the model it builds from this "
        "export lacks olmo2-tiny's query and key norms (over all heads at once): add them in pretrain_gpt.py's model "
        "provider to train the model exactly as written"
    ]
    bridge = export(plan, "bridge")
    assert yaml.safe_load(bridge.files["bridge_override.yaml"])["model"]["qk_layernorm"] is False
    assert any("no query/key norms over the whole projections (olmo2-tiny's" in w for w in bridge.warnings)
