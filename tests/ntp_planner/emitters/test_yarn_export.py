"""YaRN in every export (ModelSpec.yarn): Megatron-LM 0.19.2's --position-embedding-type yarn with its
--rotary-scaling-factor / --yarn-* / --mscale flags (MLA: --rope-type yarn), Megatron-Bridge 0.3.1's
position_embedding_type and provider fields, NeMo 2's model config fields, NeMo 1 dropping it with a
note. The loaders (test_megatron_loader, test_bridge_loader) build the models from the same words."""

from __future__ import annotations

import json

import yaml

from cost_models import MODELS
from cost_models.hf_config import model_from_hf_config
from ntp_planner.emitters import export
from tests.ntp_planner.emitters.test_model_fidelity import _args, _plan
from tests.ntp_planner.test_emitters import YARN_HF_CONFIGS

YARN_FLAGS = ("--position-embedding-type", "--rotary-scaling-factor", "--yarn-original-max-position-embeddings",
              "--yarn-beta-fast", "--yarn-beta-slow", "--mscale", "--mscale-all-dim", "--rope-type")  # fmt: skip


def _flags(args: list[str]) -> dict:
    got = {f: args[args.index(f) + 1] for f in YARN_FLAGS if f in args}
    return got | {f: True for f in args if "correction-range" in f}


def _bridge(plan) -> dict:
    return yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])["model"]


def test_gpt_oss_yarn_reaches_each_megatron_target():
    """GPT-OSS: factor 32 over 4,096 positions, betas 32 / 1, an unrounded ramp (truncate false), HF's scale
    0.1 ln 32 + 1, which megatron-core computes from mscale 1 over mscale_all_dim 0 (Megatron-LM's defaults:
    --mscale 1 is written, 0 is its default)."""
    plan = _plan("gpt-oss-20b")
    assert _flags(_args(plan)) == {
        "--position-embedding-type": "yarn", "--rotary-scaling-factor": "32",
        "--yarn-original-max-position-embeddings": "4096", "--yarn-beta-fast": "32", "--yarn-beta-slow": "1",
        "--mscale": "1", "--no-yarn-correction-range-round-to-int": True,
    }  # fmt: skip
    bridge = {k: v for k, v in _bridge(plan).items() if "yarn" in k or k == "position_embedding_type"}
    assert bridge == {
        "position_embedding_type": "yarn", "yarn_rotary_scaling_factor": 32,
        "yarn_original_max_position_embeddings": 4096, "yarn_beta_fast": 32, "yarn_beta_slow": 1,
        "yarn_correction_range_round_to_int": False, "yarn_mscale": 1, "yarn_mscale_all_dim": 0,
    }  # fmt: skip
    nemo2 = export(plan, "nemo2")
    lines = [x.strip() for x in nemo2.files["nemo2_recipe.py"].splitlines() if "yarn" in x]
    assert lines == [
        "recipe.model.config.position_embedding_type = 'yarn'", "recipe.model.config.yarn_rotary_scaling_factor = 32",
        "recipe.model.config.yarn_original_max_position_embeddings = 4096", "recipe.model.config.yarn_beta_fast = 32",
        "recipe.model.config.yarn_beta_slow = 1", "recipe.model.config.yarn_correction_range_round_to_int = False",
        "recipe.model.config.yarn_mscale = 1", "recipe.model.config.yarn_mscale_all_dim = 0",
    ]  # fmt: skip
    assert any("GPTOSSConfig" in w for w in nemo2.warnings)
    nemo = export(plan, "nemo")  # NeMo 1.x: none of it, and a note
    model = yaml.safe_load(nemo.files["nemo_config.yaml"])["model"]
    assert model["position_embedding_type"] == "rope" and not any("yarn" in k for k in model)
    assert any(w.startswith("NeMo: yarn_rotary_scaling_factor dropped") for w in nemo.warnings)


def test_deepseek_v3_yarn_is_mla_configs_own():
    """MLA takes YaRN as MLATransformerConfig's rope_type and unprefixed fields: Megatron-LM has flags for
    the factor and both mscales only (its other fields' defaults, 4,096 / 32 / 1, are DeepSeek-V3's own: no
    warning); a model whose ramp differs is warned of, as is an unrounded ramp MLA cannot build."""
    plan = _plan("deepseek-v3", tp=2, pp=4, dp=4, ep=8, etp=1, global_batch=32)
    args = _args(plan)
    assert _flags(args) == {"--position-embedding-type": "rope", "--rope-type": "yarn",
                            "--rotary-scaling-factor": "40", "--mscale": "1", "--mscale-all-dim": "1"}  # fmt: skip
    assert not [w for w in export(plan, "megatron").warnings if "YaRN" in w]
    keys = ("rope_type", "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
            "mscale", "mscale_all_dim", "position_embedding_type")  # fmt: skip
    assert {k: _bridge(plan)[k] for k in keys} == dict(zip(keys, ("yarn", 40, 4096, 32, 1, 1, 1, "rope"), strict=True))
    stretched = MODELS["deepseek-v3"].yarn.model_copy(update={"beta_fast": 64.0, "truncate": False})
    odd = _plan(MODELS["deepseek-v3"].model_copy(update={"yarn": stretched}), tp=2, pp=4, dp=4, ep=8, etp=1,
                global_batch=32)  # fmt: skip
    said = [w for w in export(odd, "megatron").warnings if "YaRN" in w]
    assert len(said) == 2 and "{'beta_fast': 64}" in said[1] and "{'beta_fast': 32}" in said[1]
    assert any("truncate false" in w for w in export(odd, "bridge").warnings)


def test_yarn_on_another_recipe_and_plain_models():
    """Qwen3 with YaRN: Megatron-LM takes it on any GPT model (factor 4 over 32,768, a rounded ramp: its
    switch, on by default, written); Bridge's Llama 3 recipe has no yarn_* fields, so the export keeps plain
    rotary positions and says so. A model without YaRN exports none of it (Llama 3.1's scaling stays its own)."""
    qwen = _plan(model_from_hf_config(YARN_HF_CONFIGS["qwen3-yarn"], "qwen3-yarn"))
    assert _flags(_args(qwen)) == {
        "--position-embedding-type": "yarn", "--rotary-scaling-factor": "4",
        "--yarn-original-max-position-embeddings": "32768", "--yarn-beta-fast": "32", "--yarn-beta-slow": "1",
        "--mscale": "1", "--yarn-correction-range-round-to-int": True,
    }  # fmt: skip
    bridge = export(qwen, "bridge")
    model = yaml.safe_load(bridge.files["bridge_override.yaml"])["model"]
    assert model["position_embedding_type"] == "rope" and not any(k.startswith("yarn_") for k in model)
    assert any("no YaRN fields" in w and "factor 4.0" in w for w in bridge.warnings)
    for name in ("llama3.1-405b", "qwen3-30b-a3b"):
        plan = _plan(name, tp=8, pp=1, dp=1, global_batch=8) if name.startswith("llama") else _plan(name)
        args = json.loads(export(plan, "megatron").files["megatron_args.json"])
        assert _flags(args) == {"--position-embedding-type": "rope"}, name
        assert not any("yarn" in k or k == "rope_type" for k in _bridge(plan)), name
