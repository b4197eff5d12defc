"""YaRN rotary scaling read from config.json (HF rope_scaling, rope_type or type "yarn") into
ModelSpec.yarn: the published GPT-OSS and DeepSeek-V3 files, Qwen3's long-context setting, and the
refusals, each naming the config key."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from cost_models import MODELS
from cost_models.hf_config import model_from_hf_config
from cost_models.model import YarnScaling
from ntp_planner.plan import Plan, inputs_hash
from topologies.errors import InputError

CONFIGS = Path(__file__).parent / "hf_configs"
QWEN3 = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())


def _read(name: str):
    return model_from_hf_config(json.loads((CONFIGS / f"{name}.json").read_text()), name).yarn


def test_published_configs_read_exactly():
    # openai/gpt-oss-*: factor 32 over 4,096 positions, betas 32 / 1, truncate false, no mscale keys
    oss = YarnScaling(factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
                      truncate=False)  # fmt: skip
    assert _read("gpt-oss-20b") == _read("gpt-oss-120b") == oss
    # deepseek-ai/DeepSeek-V3 spells the kind "type" and gives both mscales; truncate absent: true
    ds = _read("deepseek-v3")
    assert (ds.factor, ds.original_max_position_embeddings, ds.beta_fast, ds.beta_slow) == (40.0, 4096, 32.0, 1.0)
    assert (ds.mscale, ds.mscale_all_dim, ds.truncate) == (1.0, 1.0, True)
    assert _read("qwen3-30b-a3b") is None and _read("mixtral-8x7b") is None  # no rope_scaling: plain rotary
    assert (MODELS["gpt-oss-120b"].yarn, MODELS["deepseek-v3"].yarn) == (oss, ds)  # the catalogue carries them


def test_qwen3_with_yarn_and_the_transformers_defaults():
    # Qwen's model card: factor 4 over 32,768 positions; absent betas are 32 and 1
    cfg = {**QWEN3, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    y = model_from_hf_config(cfg, "q").yarn
    assert (y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow, y.mscale) == (4, 32768, 32, 1, None)
    # no original positions: max_position_embeddings (40,960), as transformers reads it; transformers 5's
    # rope_parameters too
    alone = {**QWEN3, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}
    assert model_from_hf_config(alone, "q").yarn.original_max_position_embeddings == 40960
    llama3 = {**QWEN3, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert model_from_hf_config(llama3, "q").yarn is None  # Llama 3.1's kind stays rope_scaling_factor


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"factor": 0.5}, r"rope_scaling.factor: Input should be greater than 1"),
        ({"factor": "32"}, r"rope_scaling.factor is '32'; it must be a number"),
        ({"factor": 4, "beta_fast": 1, "beta_slow": 2}, r"beta_slow\(2.0\) must be below beta_fast\(1.0\)"),
        ({"factor": 4, "mscale": 1.0}, r"mscale\(1.0\) and mscale_all_dim\(None\) scale attention as a ratio"),
        ({"factor": 4, "attention_factor": 1.2}, r"rope_scaling.attention_factor is not read by ntp"),
        ({"factor": 4, "truncate": "no"}, r"truncate is 'no'; it must be true or false"),
        ({}, r"rope_scaling.factor: Field required"),
    ],
)
def test_bad_yarn_settings_are_refused_naming_the_key(scaling, message):
    with pytest.raises(InputError, match=message):
        model_from_hf_config({**QWEN3, "rope_scaling": {"rope_type": "yarn", **scaling}}, "q")


def test_yarn_needs_rotary_positions_and_one_scaling():
    m = MODELS["llama3.1-405b"]  # Llama 3.1's own scaling (rope_scaling_factor 8)
    with pytest.raises(ValidationError, match="set position 'rope' and one scaling, not both"):
        type(m).model_validate({**m.model_dump(), "yarn": MODELS["gpt-oss-20b"].yarn.model_dump()})
    gpt = MODELS["gpt3-175b"]  # learned positions
    with pytest.raises(ValidationError, match="position is 'learned'"):
        type(gpt).model_validate({**gpt.model_dump(), "yarn": {"factor": 4, "original_max_position_embeddings": 2048}})


def test_a_model_without_yarn_hashes_as_before():
    """ModelSpec.yarn is a later field (plan.LATER_FIELDS): the committed DeepSeek-V3 plan, saved before it,
    keeps its hash; the same plan with the published YaRN hashes apart."""
    plan = Plan.load(Path(__file__).parents[1] / "ntp_planner" / "plans" / "moe_folded.json")
    assert plan.model.yarn is None
    assert inputs_hash(plan.model, plan.training, plan.cluster, plan.layout) == plan.inputs_hash
    yarn = plan.model.model_copy(update={"yarn": MODELS["deepseek-v3"].yarn})
    assert inputs_hash(yarn, plan.training, plan.cluster, plan.layout) != plan.inputs_hash
