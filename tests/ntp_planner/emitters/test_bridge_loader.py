"""Every Megatron-Bridge export, loaded by Megatron-Bridge 0.3.1 itself: the recipe a user starts
from, the export merged over it with ``process_config_with_overrides``, then
``runtime_config_update`` (mixed-precision resolution and ``validate()``), as ``pretrain`` runs
them (tests/support/bridge_loader.py, in the environment ``make test-slow`` builds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cost_models.catalogue import MODELS
from ntp_planner.emitters import export
from ntp_planner.emitters.bridge import precision_of, recipe_of
from tests.ntp_planner.emitters.test_megatron_loader import HF_CONFIGS, _catalogue_variants, _hf_plan
from tests.ntp_planner.test_emitters import LOADER_DENSE, _catalogue_plan, frozen, loader_variants, make
from topologies.gpus import GPUS

pytestmark = pytest.mark.slow

BRIDGE = os.environ.get("NTP_BRIDGE_PATH")
LOADER = Path(__file__).parents[2] / "support" / "bridge_loader.py"
HF = Path(__file__).parents[2] / "cost_models" / "hf_configs"
# the Hugging Face repository each recipe reads its config.json from (Bridge's recipes, 0.3.1)
REPOS = {
    "llama.llama2_7b_pretrain_config": ("meta-llama/Llama-2-7b-hf", "llama2-7b"),
    "llama.llama3_8b_pretrain_config": ("meta-llama/Meta-Llama-3-8B", "llama3-8b"),
    "llama.llama3_70b_pretrain_config": ("meta-llama/Meta-Llama-3-70B", "llama3-70b"),
    "llama.llama31_405b_pretrain_config": ("meta-llama/Meta-Llama-3.1-405B", "llama3.1-405b"),
    "qwen.qwen3_30b_a3b_pretrain_config": ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
    "qwen.qwen3_235b_a22b_pretrain_config": ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b"),
    "deepseek.deepseek_v3_pretrain_config": ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    "gpt_oss.gpt_oss_20b_pretrain_config": ("openai/gpt-oss-20b", "gpt-oss-20b"),
    "gpt_oss.gpt_oss_120b_pretrain_config": ("openai/gpt-oss-120b", "gpt-oss-120b"),
    "gemma.gemma2_9b_pretrain_config": ("google/gemma-2-9b", "gemma2-9b"),
}
# the activation a Bridge provider runs for each kind of MLP (megatron-core's functions' names)
ACTIVATIONS = {"silu": "silu", "gelu": "fast_gelu", "quick_gelu": "quick_gelu", "plain": "gelu"}
DEVICES = {  # what torch.cuda.get_device_properties says on each architecture's catalogue GPU
    "ampere": {"name": "NVIDIA A100-SXM4-80GB", "major": 8, "minor": 0},
    "hopper": {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0},
    "blackwell": {"name": "NVIDIA B200", "major": 10, "minor": 0},
}


def _llama_config(name: str) -> dict:
    """A Llama config.json as its authors publish it, from the catalogue's numbers."""
    m = MODELS[name]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size, "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_kv_heads, "vocab_size": m.vocab_size, "rope_theta": m.rope_theta or 10000.0,
        "rms_norm_eps": m.norm_eps or 1e-5, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, "hidden_act": "silu",
    }  # fmt: skip
    if m.rope_scaling_factor:
        config["rope_scaling"] = {"rope_type": "llama3", "factor": m.rope_scaling_factor, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    return config


def _hub_cache(folder: Path) -> Path:
    """An offline Hugging Face hub cache holding each recipe's config.json (no hub access)."""
    for repo, name in REPOS.values():
        fixture = HF / f"{name}.json"
        config = json.loads(fixture.read_text()) if fixture.exists() else HF_CONFIGS.get(name) or _llama_config(name)
        snapshot = folder / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))
        (folder / f"models--{repo.replace('/', '--')}" / "refs").mkdir(exist_ok=True)
        (folder / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text("0" * 40)
    return folder


def _variants() -> dict:
    plans = {f"catalogue:{name}": _catalogue_plan(name) for name in MODELS}
    plans |= {f"hf:{name}": _hf_plan(name) for name in HF_CONFIGS}
    plans |= {key: plan for name in MODELS for key, plan in _catalogue_variants(name).items()}
    dense = LOADER_DENSE
    plans |= loader_variants()
    plans |= {
        "moe-folded": make("qwen3-30b-a3b", 16, **{**dense, "ep": 4, "etp": 1}),
        "moe-vpp": make("deepseek-v3", 64, **{**dense, "pp": 4, "dp": 8, "vpp": 2, "ep": 8, "etp": 1,
                                              "global_batch": 64}),
        "dense-frozen": frozen("dense_pp_interleaved")[0],
        "moe-frozen": frozen("moe_folded")[0],
    }  # fmt: skip
    return plans


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Each variant's plan and what Bridge's loader made of its export."""
    if not BRIDGE or not Path(BRIDGE).is_dir():
        pytest.skip("Megatron-Bridge is not installed (make test-slow installs it under .venv/bridge)")
    folder = tmp_path_factory.mktemp("bridge")
    plans, cases = _variants(), []
    for name, plan in plans.items():
        override = folder / f"{name.replace(':', '_')}.yaml"
        override.write_text(export(plan, "bridge").files["bridge_override.yaml"])
        device = DEVICES[str(GPUS[plan.cluster.spec.gpu].architecture)]
        world = plan.layout.world_size
        build = name.startswith(("catalogue:", "hf:")) and name != "hf:gemma2-9b"  # Gemma 2: its own layer spec
        cases.append({"name": name, "recipe": recipe_of(plan)[0], "override": str(override), "world_size": world,
                      "device": device, "build": build, "vocab_size": plan.model.vocab_size})  # fmt: skip
    vpp = next(c for c in cases if c["name"] == "vpp")
    cases.append({**vpp, "name": "broken", "override": str(folder / "broken.yaml"), "build": False})
    broken = (
        export(plans["vpp"], "bridge")
        .files["bridge_override.yaml"]
        .replace("num_attention_heads: 32", "num_attention_heads: 31")
    )
    (folder / "broken.yaml").write_text(broken)
    (folder / "cases.json").write_text(json.dumps(cases))
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([BRIDGE, str(LOADER.parents[2])]),
        "HF_HUB_CACHE": str(_hub_cache(folder / "hub")),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    out = subprocess.run([sys.executable, str(LOADER), str(folder / "cases.json")], capture_output=True,
                         text=True, timeout=600, env=env)  # fmt: skip
    prefix = "ntp-bridge-result "
    results = {
        r["name"]: r for r in (json.loads(x[len(prefix) :]) for x in out.stdout.splitlines() if x.startswith(prefix))
    }
    assert len(results) == len(cases), out.stderr[-3000:]
    return plans, results


def test_every_variant_is_accepted_by_bridge_and_keeps_the_plan(loaded):
    plans, results = loaded
    refused = {n: r["error"] for n, r in results.items() if not r["ok"] and n != "broken"}
    assert refused == {}
    for name, plan in plans.items():
        got, lay, m = results[name]["fields"], plan.layout, plan.model
        want = {
            "tensor_model_parallel_size": lay.tp, "pipeline_model_parallel_size": lay.pp,
            "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
            "context_parallel_size": lay.cp, "expert_model_parallel_size": lay.ep, "data_parallel_size": lay.dp,
            "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_attention_heads": m.num_heads,
            "seq_length": plan.training.seq_len, "dataset_seq_length": plan.training.seq_len,
            "global_batch_size": lay.global_batch, "micro_batch_size": lay.micro_batch,
            "bf16": plan.training.dtype != "fp16", "params_dtype": "torch.bfloat16",
            "multi_latent_attention": m.is_mla, "use_megatron_fsdp": lay.zero >= 2,
            "ckpt_format": "fsdp_dtensor" if lay.zero >= 2 else "torch_dist", "mixed_precision": "MixedPrecisionConfig",
            "gated_linear_unit": m.gated_mlp, "add_bias_linear": m.bias,
            "share_embeddings_and_output_weights": m.tie_embeddings,
            "normalization": "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
            # YaRN where the recipe's provider takes it (GPT-OSS's; test_bridge_takes_yarn_as_the_hf_config_writes)
            "position_embedding_type": "learned_absolute" if m.position != "rope" else "yarn" if m.yarn
            and not m.is_mla and recipe_of(plan)[0].startswith("gpt_oss.") else "rope",
            # OpenAI's x * sigmoid(1.702 x) gate from GPT-OSS's recipe; Nemotron's squared ReLU has no recipe
            # (the export says the model gets GELU)
            "activation": ACTIVATIONS[m.gate_activation if m.gated_mlp else "plain"],
            # Qwen3's recipe keeps its own, another recipe's is turned off; OLMo 2's whole-projection norms: none
            "qk_layernorm": (m.qk_norm and m.qk_norm_span == "head") or m.is_mla,
            # Llama 4 Scout's L2 query/key norm (the field; the export says only Bridge's Llama 4 provider builds
            # it), Nemotron's and Gemma's (1 + w) norms, Nemotron's half-head rotation
            "qk_l2_norm": m.qk_l2_norm, "layernorm_zero_centered_gamma": m.norm_zero_centered,
            "rotary_percent": m.rotary_fraction,  # Llama 4's NoPE layers, as megatron-core expands no_rope_freq 4
            "no_rope_freq": [int((i + 1) % m.nope_every == 0) for i in range(m.num_layers)] if m.nope_every else None,
        }  # fmt: skip
        if m.gated_mlp and m.gate_activation == "quick_gelu":
            want |= {"glu_linear_offset": m.gate_linear_offset, "activation_func_clamp_value": m.activation_clamp}
        if m.rope_theta:
            want["rotary_base"] = m.rope_theta
        if m.is_moe:
            want |= {"num_moe_experts": m.num_experts, "moe_router_topk": m.moe_top_k}
        assert {k: got[k] for k in want} == want, name


def test_fp8_plans_get_bridges_fp8_recipe_and_its_differences_are_said(loaded):
    plans, results = loaded
    assert results["fp8-delayed"]["fields"]["fp8_recipe"] == "delayed"
    assert results["fp8-current"]["fields"]["fp8_recipe"] == "tensorwise"
    assert results["fp8-delayed"]["fields"]["fp8"] == "hybrid"
    # the plan keeps bf16 weights; Bridge's fp8 recipes gather fp8 ones: the export says so
    recipe, said = precision_of(plans["fp8-delayed"])
    assert recipe == "bf16_with_fp8_delayed_scaling_mixed"
    assert any("gathers the weights" in w for w in said)


def test_bridge_rejects_a_broken_export(loaded):
    """The loader can fail: 31 heads over TP 2 is refused by Bridge's own checks."""
    _, results = loaded
    assert results["broken"]["ok"] is False
    assert "31" in results["broken"]["error"] or "divisible" in results["broken"]["error"]


def test_a_model_on_another_models_recipe_loses_that_recipes_qk_norm(loaded):
    """Mixtral has no Bridge recipe and starts from Qwen3-30B's, whose attention has QK
    layernorm; the export turns it off, Qwen3's own keeps it."""
    _, results = loaded
    assert results["catalogue:mixtral-8x7b"]["fields"]["qk_layernorm"] is False
    assert results["catalogue:qwen3-30b-a3b"]["fields"]["qk_layernorm"] is True


def test_bridge_builds_the_model_ntp_counts(loaded):
    """The model Bridge's provider builds from each export (``provide()`` on the meta device, local
    layers, no MTP module) has ntp's parameter count (Qwen3's QK norms included) plus what ntp's
    count leaves out: learned positions for seq_length, not the model's (the export warns); less what
    Bridge cannot build: OLMo 2's query/key norms over the whole projections (the export warns).
    GPT-OSS's router biases are in both. Gemma 2's provider has its own layer spec (post-norms), which
    the local layers do not build: not counted here."""
    plans, results = loaded
    built = {n: r["params_total"] for n, r in results.items() if "params_total" in r}
    want = {}
    for n in built:
        m = plans[n].model
        positions = (plans[n].training.seq_len - m.max_position_embeddings) * m.hidden_size  # Bridge: seq_length rows
        whole_qk = m.num_layers * m.qk_norm_params if m.qk_norm and m.qk_norm_span == "projection" else 0
        want[n] = m.params_total + (positions if m.position == "learned" else 0) - whole_qk
    assert len(built) == len(MODELS) + len(HF_CONFIGS) - 1 and built == want  # Gemma 2: not built
    assert plans["hf:olmo2-1b"].model.params_total - built["hf:olmo2-1b"] == 16 * (2048 + 2048)
    assert built["catalogue:llama3-8b"] == 8_030_261_248 and built["hf:qwen2.5-7b"] == 7_615_616_512


def test_bridge_takes_yarn_as_the_hf_config_writes(loaded):
    """GPT-OSS's provider gets position_embedding_type 'yarn' and its yarn_* fields as the published
    config.json has them (mscale 1 and mscale_all_dim 0 give megatron-core's 0.1 ln s + 1, HF's rule without
    mscale keys); DeepSeek-V3's MLA provider its unprefixed fields; Qwen3 with YaRN on Llama 3's recipe, whose
    provider has no YaRN fields, plain rotary positions and a warning."""
    plans, results = loaded
    oss = json.loads((HF / "gpt-oss-20b.json").read_text())["rope_scaling"]
    got = {k: v for k, v in results["catalogue:gpt-oss-20b"]["fields"].items() if k.startswith("yarn_")}
    assert got == {
        "yarn_rotary_scaling_factor": oss["factor"], "yarn_original_max_position_embeddings": 4096,
        "yarn_beta_fast": oss["beta_fast"], "yarn_beta_slow": oss["beta_slow"],
        "yarn_correction_range_round_to_int": oss["truncate"], "yarn_mscale": 1, "yarn_mscale_all_dim": 0,
    }  # fmt: skip
    ds = json.loads((HF / "deepseek-v3.json").read_text())["rope_scaling"]
    keys = ("rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
            "mscale_all_dim")  # fmt: skip
    hf_keys = ("factor", *keys[1:])
    fields = results["catalogue:deepseek-v3"]["fields"]
    assert {k: fields[k] for k in ("rope_type", *keys)} == {"rope_type": ds["type"]} | {
        k: ds[h] for k, h in zip(keys, hf_keys, strict=True)
    }
    qwen = results["hf:qwen3-yarn"]["fields"]
    assert qwen["position_embedding_type"] == "rope" and qwen["yarn_rotary_scaling_factor"] is None
    assert any("no YaRN fields" in w for w in export(plans["hf:qwen3-yarn"], "bridge").warnings)
