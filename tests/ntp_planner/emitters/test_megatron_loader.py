"""Every Megatron-LM export, read by Megatron-LM itself: the exported argv through
``megatron.training.arguments.parse_args`` and ``validate_args`` from the megatron-core 0.19.2
wheel, in the launch script's environment, and the model it would build counted on the meta
device (tests/support/megatron_loader.py, in the folder ``make test-slow`` builds)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cost_models.catalogue import MODELS
from cost_models.hf_config import model_from_hf_config
from cost_models.training import TrainingSpec
from ntp_planner.emitters import export
from ntp_planner.emitters.common import expressible_layout
from ntp_planner.failures.replan import Replanner
from ntp_planner.solver.planner import make_plan, plan_from_layout
from ntp_planner.solver.search import SearchSpace
from tests.ntp_planner.test_emitters import (
    LOADER_DENSE,
    YARN_HF_CONFIGS,
    _catalogue_plan,
    frozen,
    loader_variants,
    make,
)
from topologies import CLUSTERS, Cluster
from topologies.gpus import GPUS

pytestmark = pytest.mark.slow

MEGATRON = os.environ.get("NTP_MEGATRON_PATH")
LOADER = Path(__file__).parents[2] / "support" / "megatron_loader.py"
DEVICES = {  # what torch.cuda.get_device_properties says on each architecture's catalogue GPU
    "ampere": {"name": "NVIDIA A100-SXM4-80GB", "major": 8, "minor": 0},
    "hopper": {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0},
    "blackwell": {"name": "NVIDIA B200", "major": 10, "minor": 0},
}


def _per_layer_plan():
    return make_plan(
        MODELS["llama3-8b"], TrainingSpec(seq_len=8192, global_batch=256),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64), top=1, space=SearchSpace(zeros=(1,)),
    )  # fmt: skip


# config.json files as their authors publish them (Gemma 2 9B, Qwen2.5 7B, OLMo 2 1B), for what the catalogue
# lacks: a GELU-gated MLP with sliding windows and (1 + w) norms, QKV-only biases, query/key norms over the
# whole projections
HF_CONFIGS = {
    "gemma2-9b": {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 4096,
        "max_position_embeddings": 8192,
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    },
    "olmo2-1b": {
        "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2",
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16,
        "num_key_value_heads": 16, "vocab_size": 100352, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 500000, "max_position_embeddings": 4096, "tie_word_embeddings": False,
    },
    **YARN_HF_CONFIGS,
}  # fmt: skip


def _hf_plan(name: str):
    m = model_from_hf_config(HF_CONFIGS[name], name)
    return make(m, 8, tp=2, pp=2, dp=2, global_batch=8, sequence_parallel=True, distributed_optimizer=True)


def _catalogue_variants(name: str) -> dict:
    """The catalogue plan of ``name`` interleaved (vpp 2), with context parallelism (cp 2), with
    ZeRO-3 (Megatron-FSDP) and in fp8: the issue's variants for every model."""
    base = _catalogue_plan(name)
    lay = base.layout
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=lay.world_size)
    kw = dict(tp=lay.tp, pp=lay.pp, dp=lay.dp, ep=lay.ep, etp=lay.etp, global_batch=lay.global_batch,
              sequence_parallel=lay.sequence_parallel, distributed_optimizer=True)  # fmt: skip
    fp8 = TrainingSpec(seq_len=2048, global_batch=lay.global_batch, dtype="fp8", fp8_recipe="current")
    return {
        f"vpp:{name}": make(name, lay.world_size, seq=2048, **kw, vpp=2),
        f"cp:{name}": make(name, lay.world_size, seq=2048, **{**kw, "pp": 1, "dp": lay.dp}, cp=2),
        f"zero3:{name}": make(name, lay.world_size, seq=2048, **{**kw, "pp": 1, "dp": 2 * lay.dp}, zero=3),
        f"fp8:{name}": plan_from_layout(base.model, fp8, cluster, lay),
    }


def _variants() -> dict:
    """name -> (plan, re-plan or None): every catalogue model, then each variant of the issue."""
    plans = {f"catalogue:{name}": (_catalogue_plan(name), None) for name in MODELS}
    plans |= {f"hf:{name}": (_hf_plan(name), None) for name in HF_CONFIGS}
    plans |= {key: (plan, None) for name in MODELS for key, plan in _catalogue_variants(name).items()}
    dense = LOADER_DENSE
    plans |= {key: (plan, None) for key, plan in loader_variants().items()}
    plans |= {
        "zero2": (make("llama3-8b", 16, **{**dense, "pp": 1, "dp": 8, "zero": 2}), None),
        "zero3-tp1": (make("llama3-8b", 16, **{**dense, "tp": 1, "pp": 1, "dp": 16, "zero": 3,
                                               "sequence_parallel": False}), None),
        "moe-folded": (make("qwen3-30b-a3b", 16, **{**dense, "ep": 4, "etp": 1}), None),
        "moe-vpp": (make("deepseek-v3", 64, **{**dense, "pp": 4, "dp": 8, "vpp": 2, "ep": 8, "etp": 1,
                                               "global_batch": 64}), None),
        "dense-frozen": frozen("dense_pp_interleaved"),
        "moe-frozen": frozen("moe"),
        "moe-folded-frozen": frozen("moe_folded"),
        "ntp-replan": frozen("ntp_replanned"),
        "per-layer": (_per_layer_plan(), None),
    }  # fmt: skip
    plan, _ = frozen("ntp_replanned")
    plans["ntp-replan"] = (plan, Replanner(plan).replan(frozenset({3, 12}), "ntp"))
    return plans


def _environment(script: str) -> dict:
    """The variables the launch script exports (``export NAME=value``)."""
    return dict(re.findall(r"^export (\w+)=(\S*)$", script, flags=re.M))


def _case(name: str, plan, replan) -> dict:
    files = export(plan, "megatron", replan=replan).files
    return {
        "name": name, "args": json.loads(files["megatron_args.json"]), "env": _environment(files["launch_megatron.sh"]),
        "world_size": plan.layout.world_size, "device": DEVICES[str(GPUS[plan.cluster.spec.gpu].architecture)],
        "build": name.startswith(("catalogue:", "hf:")),
    }  # fmt: skip


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Each variant's plan and what Megatron-LM's argument code made of its export."""
    if not MEGATRON or not Path(MEGATRON).is_dir():
        pytest.skip("megatron-core 0.19 is not installed (make test-slow installs it under .venv/megatron)")
    folder = tmp_path_factory.mktemp("megatron")
    plans = _variants()
    cases = [_case(name, plan, replan) for name, (plan, replan) in plans.items()]
    broken = _case("broken", *plans["vpp"])
    broken["args"][broken["args"].index("--global-batch-size") + 1] = "15"  # not micro-batch 1 x dp 4 x k
    typo = _case("unknown-flag", *plans["vpp"])
    typo["args"].append("--overlap-p2p-communication")  # the flag ntp once wrote: no Megatron has it
    fsdp_env = _case("fsdp-one-connection", *plans["zero3-tp1"])
    fsdp_env["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    (folder / "cases.json").write_text(json.dumps([*cases, broken, typo, fsdp_env]))
    env = os.environ | {"PYTHONPATH": os.pathsep.join([MEGATRON, str(LOADER.parents[2])])}
    out = subprocess.run([sys.executable, "-W", "ignore", str(LOADER), str(folder / "cases.json")],
                         capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    prefix = "ntp-megatron-result "
    results = {
        r["name"]: r for r in (json.loads(x[len(prefix) :]) for x in out.stdout.splitlines() if x.startswith(prefix))
    }
    assert len(results) == len(cases) + 3, out.stderr[-3000:]
    return {name: plan for name, (plan, _) in plans.items()}, results


def test_every_variant_is_accepted_by_megatron_and_keeps_the_plan(loaded):
    plans, results = loaded
    refused = {n: r["error"] for n, r in results.items() if not r["ok"] and n in plans}
    assert refused == {}
    for name, plan in plans.items():
        got, m, t = results[name]["fields"], plan.model, plan.training
        lay = expressible_layout(plan, "Megatron-LM")[0]  # per-layer TP: its projection
        want = {
            "tensor_model_parallel_size": lay.tp, "pipeline_model_parallel_size": lay.pp,
            "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
            "context_parallel_size": lay.cp, "data_parallel_size": lay.dp, "num_layers": m.num_layers,
            "hidden_size": m.hidden_size, "num_attention_heads": m.num_heads, "seq_length": t.seq_len,
            "global_batch_size": lay.global_batch, "micro_batch_size": lay.micro_batch, "bf16": t.dtype != "fp16",
            "use_megatron_fsdp": lay.zero >= 2, "multi_latent_attention": m.is_mla,
            "ckpt_format": "fsdp_dtensor" if lay.zero >= 2 else "torch_dist",
            "add_bias_linear": m.bias, "add_qkv_bias": m.bias or m.qkv_bias,  # Megatron: biases imply QKV ones
            "untie_embeddings_and_output_weights": not m.tie_embeddings,
            "swiglu": m.gated_mlp and m.gate_activation == "silu",
            "quick_geglu": m.gated_mlp and m.gate_activation in ("gelu", "quick_gelu"),
            "squared_relu": not m.gated_mlp and m.mlp_activation == "squared_relu",
            # MLA's latent norms ride on the same flag; OLMo 2's whole-projection norms have none
            "qk_layernorm": (m.qk_norm and m.qk_norm_span == "head") or m.is_mla,
            "glu_linear_offset": m.gate_linear_offset if m.gated_mlp else 0.0,
            "activation_func_clamp_value": m.activation_clamp if m.gated_mlp else None,
            "qk_l2_norm": m.qk_l2_norm, "layernorm_zero_centered_gamma": m.norm_zero_centered,
            "rotary_percent": m.rotary_fraction, "no_rope_freq": m.nope_every or None,
        }  # fmt: skip
        if m.position == "rope":
            want["rotary_base"] = int(m.rope_theta or 10000)  # unset in the catalogue: Megatron's default
        if m.norm_eps:
            want["layernorm_epsilon"] = m.norm_eps
        if m.is_moe:
            want |= {"num_experts": m.num_experts, "moe_router_topk": m.moe_top_k,
                     "expert_model_parallel_size": lay.ep}  # fmt: skip
            if m.moe_aux_loss_coeff:
                want["moe_aux_loss_coeff"] = m.moe_aux_loss_coeff
        assert {k: got[k] for k in want} == want, name


def _whole_qk_norms(m) -> int:
    """OLMo 2's query/key norms over the whole projections, which Megatron-LM's command line cannot
    build (the export says so; megatron-core's qk_layernorm norms each head)."""
    return m.num_layers * m.qk_norm_params if m.qk_norm and m.qk_norm_span == "projection" else 0


def _post_norms(m) -> int:
    """Gemma 2's norms after attention and after the MLP, which Megatron-LM's command line cannot
    build (the export says so): two norms of the hidden width a layer."""
    return m.num_layers * 2 * m.hidden_size if m.post_norms else 0


def test_megatron_builds_the_model_ntp_counts(loaded):
    """The model Megatron builds from each catalogue export (GPTModel on the meta device, local
    spec) has the parameters ntp counts for it, MTP modules included (Megatron builds them):
    shapes, gating, biases (GPT-OSS's routers' too), tying, MLA with its latent norms, Qwen3's per-head
    QK norms, MTP."""
    plans, results = loaded
    built = {n: results[n]["built"]["params_total"] for n in plans if n.startswith(("catalogue:", "hf:"))}
    ours = {
        n: (m := plans[n].model).params_total + m.mtp_params - _post_norms(m) - _whole_qk_norms(m) for n in built
    }  # fmt: skip
    assert built == ours
    assert built["catalogue:llama3-8b"] == 8_030_261_248  # Meta's model card: 8.03B
    assert built["catalogue:deepseek-v3"] - plans["catalogue:deepseek-v3"].model.mtp_params == 671_026_404_352
    assert built["catalogue:qwen3-30b-a3b"] == 30_532_122_624  # transformers' Qwen3-30B-A3B, q/k norms included
    oss = plans["catalogue:gpt-oss-20b"].model  # its routers' biases (24 layers x 32 experts) in both counts
    assert oss.router_params == 32 * (2880 + 1)
    # OLMo 2 1B: 16 layers x (2048 + 2048) whole-projection q/k norms that Megatron's command line cannot build
    assert ours["hf:olmo2-1b"] == plans["hf:olmo2-1b"].model.params_total - 16 * 4096
    # Gemma 2 9B: 9,241,705,984 in transformers (ntp's count), whose post-norms (2 x 3584 x 42) Megatron lacks
    assert plans["hf:gemma2-9b"].model.params_total == 9_241_705_984
    assert built["hf:gemma2-9b"] == 9_241_705_984 - 2 * 3584 * 42
    assert built["hf:qwen2.5-7b"] == 7_615_616_512  # Qwen's model card: 7.61B, QKV biases included


def test_megatron_gates_each_mlp_as_its_authors_wrote(loaded):
    """SwiGLU for Llama, a GELU gate for Gemma (Megatron-LM's only one on its command line is quick
    GELU: the export says so), a plain GELU MLP for GPT-3, GPT-OSS's quick-GELU gate with its offset
    and clamp, Nemotron's squared ReLU."""
    _, results = loaded
    names = ("catalogue:llama3-8b", "hf:gemma2-9b", "catalogue:gpt3-175b", "catalogue:gpt-oss-20b",
             "catalogue:nemotron4-15b")  # fmt: skip
    gates = {n: tuple(results[n]["built"][k] for k in ("gated_linear_unit", "activation", "glu_linear_offset",
                                                        "activation_func_clamp_value")) for n in names}  # fmt: skip
    assert gates == {"catalogue:llama3-8b": (True, "silu", 0.0, None), "hf:gemma2-9b": (True, "quick_gelu", 0.0, None),
                     "catalogue:gpt3-175b": (False, "gelu", 0.0, None),
                     "catalogue:gpt-oss-20b": (True, "quick_gelu", 1.0, 7.0),  # OpenAI's clamped, offset gate
                     "catalogue:nemotron4-15b": (False, "squared_relu", 0.0, None)}  # fmt: skip


def test_fp8_plans_get_megatrons_fp8_recipe(loaded):
    _, results = loaded
    assert (results["fp8-delayed"]["fields"]["fp8"], results["fp8-delayed"]["fields"]["fp8_recipe"]) == (
        "hybrid", "delayed")  # fmt: skip
    assert results["fp8-current"]["fields"]["fp8_recipe"] == "tensorwise"


def test_megatron_rejects_a_broken_export(loaded):
    """The loader can fail: a global batch of 15 over dp 4, a flag no Megatron has, FSDP with one connection."""
    _, results = loaded
    assert results["broken"]["ok"] is False and "divisible" in results["broken"]["error"]
    assert results["unknown-flag"]["ok"] is False
    assert "unrecognized arguments: --overlap-p2p-communication" in results["unknown-flag"]["error"]
    assert results["fsdp-one-connection"]["ok"] is False
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in results["fsdp-one-connection"]["error"]


def test_megatron_builds_the_norms_and_rotation_as_written(loaded):
    """From the exported flags Megatron builds Llama 4 Scout's L2 query/key norms (a query and a key
    norm in each of 48 layers, the NoPE ones too, which the export warns of; Maverick none), Llama 4's
    12 layers without rotary positions, Nemotron's LayerNorm1P (--apply-layernorm-1p sets
    layernorm_zero_centered_gamma, Gemma 2's RMSNorm too) and its rotation of half of each 128-wide
    head (--rotary-percent 0.5: a 64-wide rotary embedding)."""
    plans, results = loaded
    built = {n: results[n]["built"] for n in plans if n.startswith(("catalogue:", "hf:"))}
    assert {n: b["l2_norms"] for n, b in built.items() if b["l2_norms"]} == {"catalogue:llama4-scout": 2 * 48}
    nope = {n: b["nope_layers"] for n, b in built.items() if b["nope_layers"]}  # Llama 4: layers 4, 8, ..., 48
    assert nope == {"catalogue:llama4-scout": 12, "catalogue:llama4-maverick": 12}
    zero_centered = {n for n, b in built.items() if b["zero_centered_gamma"]}
    assert zero_centered == {f"catalogue:{n}" for n in MODELS if n.startswith("nemotron")} | {"hf:gemma2-9b"}
    rotary = {n: b["rotary_dim"] for n, b in built.items()}
    assert rotary["catalogue:nemotron4-15b"] == 64 and rotary["catalogue:llama3-8b"] == 128
    assert all(rotary[n] == plans[n].model.head_dim * plans[n].model.rotary_fraction for n in rotary
               if plans[n].model.position == "rope" and not plans[n].model.is_mla)  # fmt: skip


FIXTURES = Path(__file__).parents[2] / "cost_models" / "hf_configs"
YARN_MODELS = {  # loader case -> the config.json it was read from (the catalogue's follow the fixtures)
    "catalogue:gpt-oss-20b": json.loads((FIXTURES / "gpt-oss-20b.json").read_text()),
    "catalogue:gpt-oss-120b": json.loads((FIXTURES / "gpt-oss-120b.json").read_text()),
    "catalogue:deepseek-v3": json.loads((FIXTURES / "deepseek-v3.json").read_text()),
    "hf:qwen3-yarn": YARN_HF_CONFIGS["qwen3-yarn"],
}


def _hf_yarn(config: dict, mla: bool) -> dict:
    """What HF's YaRN rotates with, from a config.json's rope_scaling, by transformers' rules: absent
    betas 32 and 1, original positions max_position_embeddings, truncate true, and the
    attention scale (0.1 m ln s + 1) / (0.1 m_all ln s + 1) with mscale and mscale_all_dim, else
    0.1 ln s + 1. megatron-core's MLA always rounds (the export warns where truncate is false)."""
    rs, s = config["rope_scaling"], config["rope_scaling"]["factor"]
    m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
    scale = (0.1 * m * math.log(s) + 1) / (0.1 * m_all * math.log(s) + 1) if m and m_all else 0.1 * math.log(s) + 1
    return {
        "scaling_factor": s,
        "original_max_position_embeddings": rs.get("original_max_position_embeddings",
                                                   config["max_position_embeddings"]),
        "beta_fast": rs.get("beta_fast", 32), "beta_slow": rs.get("beta_slow", 1),
        "correction_range_round_to_int": True if mla else rs.get("truncate", True), "attention_scale": scale,
    }  # fmt: skip


def test_megatron_builds_yarn_as_the_hf_config_writes(loaded):
    """GPT-OSS (factor 32 over 4,096 positions, unrounded ramp, scale 0.1 ln 32 + 1 = 1.3466), DeepSeek-V3's
    MLA (factor 40, mscale = mscale_all_dim = 1: scale 1) and Qwen3 with YaRN (factor 4 over 32,768) come out
    of Megatron-LM's arguments with the YaRN rotary embedding their config.json files describe; no other
    model gets one."""
    plans, results = loaded
    built = {n: results[n]["built"]["yarn"] for n in plans if n.startswith(("catalogue:", "hf:"))}
    assert {n for n, y in built.items() if y is not None} == set(YARN_MODELS)
    for name, config in YARN_MODELS.items():
        mla = plans[name].model.is_mla
        assert built[name] == pytest.approx(_hf_yarn(config, mla), rel=1e-12), name
        fields = results[name]["fields"]
        assert (fields["position_embedding_type"], fields["rope_type"]) == (("rope", "yarn") if mla else ("yarn", None))
    assert built["catalogue:gpt-oss-20b"]["attention_scale"] == pytest.approx(1.3465735902799727)
