"""NeMo 2 exports, loaded by nemo-toolkit 2.7.3 itself: the exported script builds the model's
``pretrain_recipe`` and applies ``configure``, then NeMo builds the trainer's MegatronStrategy,
the mixed-precision plugin and the model, and copies the strategy's parallelism into the model's
TransformerConfig, whose checks run again (tests/support/nemo_loader.py, in the environment
``make test-slow`` builds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ntp_planner.emitters import export
from ntp_planner.emitters.nemo2 import RECIPES
from tests.ntp_planner.test_emitters import LOADER_DENSE, _catalogue_plan, frozen, loader_variants, make

pytestmark = pytest.mark.slow

NEMO = os.environ.get("NTP_NEMO_PATH")
LOADER = Path(__file__).parents[2] / "support" / "nemo_loader.py"
MARK = "ntp-nemo-result "


def _variants() -> dict:
    plans = loader_variants() | {
        # Mixtral's recipe sets vpp 8 of its own: a plan without vpp must clear it
        "moe": make("mixtral-8x7b", 16, **{**LOADER_DENSE, "ep": 4, "etp": 1}),
        "dense-frozen": frozen("dense_pp_interleaved")[0],
        "moe-frozen": frozen("moe_folded")[0],
    }  # fmt: skip
    plans |= {f"catalogue:{name}": _catalogue_plan(name) for name in RECIPES}  # every model with a NeMo recipe
    return plans


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Each variant's plan and what NeMo made of its export."""
    if not NEMO or not Path(NEMO).is_dir():
        pytest.skip("nemo-toolkit is not installed (make test-slow installs it under .venv/nemo)")
    folder = tmp_path_factory.mktemp("nemo")
    plans, cases = _variants(), []
    for name, plan in plans.items():
        script = folder / f"{name.replace(':', '_')}.py"
        script.write_text(export(plan, "nemo2").files["nemo2_recipe.py"])
        cases.append({"name": name, "path": str(script)})
    broken = export(plans["vpp"], "nemo2").files["nemo2_recipe.py"]
    assert "strategy.tensor_model_parallel_size = 2\n" in broken
    (folder / "broken.py").write_text(
        broken.replace("tensor_model_parallel_size = 2\n", "tensor_model_parallel_size = 3\n")
    )
    cases.append({"name": "broken", "path": str(folder / "broken.py")})
    (folder / "cases.json").write_text(json.dumps(cases))
    env = os.environ | {"PYTHONPATH": str(Path(NEMO).resolve()), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(LOADER), str(folder / "cases.json")], capture_output=True,
                         text=True, timeout=600, env=env, cwd=folder)  # fmt: skip
    results = {
        r["name"]: r for r in (json.loads(x[len(MARK) :]) for x in out.stdout.splitlines() if x.startswith(MARK))
    }
    assert len(results) == len(cases), out.stderr[-3000:]
    return plans, results


def test_every_variant_is_accepted_by_nemo_and_keeps_the_plan(loaded):
    plans, results = loaded
    refused = {n: r["error"] for n, r in results.items() if not r["ok"] and n != "broken"}
    assert refused == {}
    for name, plan in plans.items():
        got, lay, m = results[name], plan.layout, plan.model
        want = {
            "tensor_model_parallel_size": lay.tp, "pipeline_model_parallel_size": lay.pp,
            "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
            "context_parallel_size": lay.cp, "sequence_parallel": lay.sequence_parallel,
            "expert_model_parallel_size": lay.ep,
        }  # fmt: skip
        assert {k: got["strategy"][k] for k in want} == want, name
        # what the model's TransformerConfig holds after NeMo copied the strategy's parallelism into it
        assert {k: got["config"][k] for k in want if k != "virtual_pipeline_model_parallel_size"} == {
            k: v for k, v in want.items() if k != "virtual_pipeline_model_parallel_size"
        }, name
        assert got["data"] == {"micro_batch_size": lay.micro_batch, "global_batch_size": lay.global_batch,
                               "seq_length": plan.training.seq_len}, name  # fmt: skip
        assert got["nodes"] * got["devices"] == lay.world_size, name
        assert got["config"]["bf16"] is (plan.training.dtype != "fp16"), name
        if m.rope_theta:
            assert got["config"]["rotary_base"] == m.rope_theta, name
        if m.is_moe:
            assert (got["config"]["num_moe_experts"], got["config"]["moe_router_topk"]) == (m.num_experts, m.moe_top_k)


def test_mixtrals_own_vpp_is_cleared(loaded):
    """llm.mixtral_8x7b's recipe sets vpp 8; the plan has none and NeMo must end with none."""
    _, results = loaded
    assert results["moe"]["strategy"]["virtual_pipeline_model_parallel_size"] is None
    assert results["moe"]["config"]["virtual_pipeline_model_parallel_size"] is None


def test_zero3_runs_on_megatron_fsdp_and_fp8_on_te_recipes(loaded):
    _, results = loaded
    assert results["zero3"]["fsdp"] == "megatron"
    assert results["zero3"]["ddp"]["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert results["vpp"]["fsdp"] is None
    delayed = results["fp8-delayed"]["config"]
    assert (delayed["fp8"], delayed["fp8_recipe"]) == ("hybrid", "delayed")
    assert results["fp8-current"]["config"]["fp8_recipe"] == "tensorwise"
    assert results["vpp"]["config"]["fp8"] is None


def test_nemo_rejects_a_broken_export(loaded):
    """The loader can fail: Llama 3 8B's 32 heads over TP 3 is refused by megatron-core's checks."""
    _, results = loaded
    assert results["broken"]["ok"] is False
    assert "num_attention_heads (32)" in results["broken"]["error"] or "divisible" in results["broken"]["error"]
