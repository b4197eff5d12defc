"""Exports: golden files for three frozen plans, megatron-core and OmegaConf reading them, shell safety."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.cli import app
from ntp_planner.emitters import FORMATS, export
from ntp_planner.emitters.megatron import megatron_args
from ntp_planner.failures.replan import Replanner
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult
from ntp_planner.solver.planner import plan_from_layout
from tests.support.megatron_config import transformer_config_kwargs
from topologies import CLUSTERS, Cluster
from topologies.errors import InputError

GOLDEN = Path(__file__).parent / "golden"
FROZEN = Path(__file__).parent / "plans"
UPDATE = os.environ.get("NTP_UPDATE_GOLDEN") == "1"


def make(model, gpus, seq=4096, **layout):
    lay = ParallelLayout(**layout)
    return plan_from_layout(
        MODELS[model] if isinstance(model, str) else model,
        TrainingSpec(seq_len=seq, global_batch=lay.global_batch),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus),
        lay,
    )


# The export goldens are made from frozen plans (tests/ntp_planner/plans/<case>.json, with
# <case>.replan.json for a re-plan), not from a fresh plan: a change to the cost model or the
# solver leaves them alone, and an export change shows as a diff of the exported files only.
# They were written by Plan.save from these calls (recreate one only when the Plan schema changes):
#   dense_pp_interleaved: make("llama3-8b", 64, tp=4, pp=4, dp=4, vpp=2, global_batch=64,
#       sequence_parallel=True, distributed_optimizer=True, recompute="selective", pp_layers=(7, 9, 9, 7))
#   moe: make("mixtral-8x7b", 64, tp=2, pp=2, dp=16, ep=8, global_batch=128, sequence_parallel=True,
#       distributed_optimizer=True)
#   ntp_replanned: make("llama3-8b", 64, tp=8, pp=2, dp=4, global_batch=32, sequence_parallel=True,
#       distributed_optimizer=True), and Replanner(plan).replan(frozenset({3, 12}), "ntp")
#   moe_folded: make("deepseek-v3", 256, tp=2, pp=8, dp=16, vpp=2, ep=16, etp=1, moe_dispatcher="flex",
#       moe_overlap="1f1b", global_batch=256, sequence_parallel=True, distributed_optimizer=True)
CASES = ["dense_pp_interleaved", "moe", "ntp_replanned", "moe_folded"]
# (case, target) pairs the target refuses, with the refusal: torchtitan has no Mixtral model
REFUSED = {("moe", "torchtitan"): "torchtitan 0.3.0 has no model for 'mixtral-8x7b'"}


def frozen(case: str) -> tuple[Plan, ReplanResult | None]:
    """The frozen plan of ``case`` and its frozen re-plan, if it has one."""
    replan = FROZEN / f"{case}.replan.json"
    return Plan.load(FROZEN / f"{case}.json"), (
        ReplanResult.model_validate_json(replan.read_text()) if replan.exists() else None
    )


def pinned(name: str, text: str, plan: Plan) -> str:
    """What a golden file pins of an exported file: all of it, except that the cost floats
    ``plan_export.json`` copies from the plan are checked here against the plan exactly and kept
    in the golden to 4 significant digits (16 digits of a prediction are not what it is about)."""
    if name != "plan_export.json":
        return text
    data = json.loads(text)
    assert data["predicted"] == {"step_time_s": plan.predicted.step_time_s, "mfu": plan.predicted.mfu}
    data["predicted"] = {k: float(f"{v:.4g}") for k, v in data["predicted"].items()}
    return json.dumps(data, indent=1) + "\n"


def check_golden(folder: Path, files: dict[str, str], update: bool) -> None:
    """Compare ``files`` (name -> text) with the golden files in ``folder``. In update mode,
    rewrite the ones that differ or are missing and fail, naming them, so that the run which
    rewrote them never passes and a person reviews the diff before committing it."""
    rewritten = []
    for name, text in files.items():
        golden = folder / name
        if golden.exists() and golden.read_text() == text:
            continue
        if update:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
            rewritten.append(str(golden))
            continue
        assert golden.exists(), f"missing golden file {golden}; run with NTP_UPDATE_GOLDEN=1 once and review it"
        assert text == golden.read_text(), f"{folder.name}/{name} differs from its golden file"
    if rewritten:
        pytest.fail(
            f"NTP_UPDATE_GOLDEN=1 rewrote {', '.join(rewritten)}: review `git diff {folder}` and rerun without it"
        )


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_golden_files(case, fmt):
    plan, replan = frozen(case)
    if (case, fmt) in REFUSED:
        with pytest.raises(InputError, match=REFUSED[case, fmt]):
            export(plan, fmt)
        return
    out = export(plan, fmt, replan=replan if fmt == "megatron" else None)  # only Megatron takes one
    check_golden(GOLDEN / case, {name: pinned(name, text, plan) for name, text in out.files.items()}, UPDATE)


def test_golden_update_mode_rewrites_and_fails(tmp_path):
    (tmp_path / "same.txt").write_text("kept\n")
    (tmp_path / "old.txt").write_text("before\n")
    files = {"same.txt": "kept\n", "old.txt": "after\n", "new.txt": "added\n"}
    with pytest.raises(AssertionError, match="old.txt differs"):
        check_golden(tmp_path, files, update=False)
    with pytest.raises(pytest.fail.Exception, match=r"rewrote \S*old.txt, \S*new.txt: review"):
        check_golden(tmp_path, files, update=True)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == files
    check_golden(tmp_path, files, update=True)  # nothing left to rewrite: the run passes
    check_golden(tmp_path, files, update=False)


def test_the_same_plan_exports_the_same_bytes():
    # a plan saved and loaded again (what `ntp export` reads) exports byte for byte what the
    # plan object it was saved from does, in every format
    plan, replan = frozen("ntp_replanned")
    again = Plan.model_validate_json(plan.model_dump_json())
    for fmt in FORMATS:
        r = replan if fmt == "megatron" else None
        assert export(again, fmt, replan=r).files == export(plan, fmt, replan=r).files


def _ntp_case():
    plan, _ = frozen("ntp_replanned")
    return plan, Replanner(plan).replan(frozenset({3, 12}), "ntp")


def test_ntp_settings_follow_megatrons_config():
    plan, replan = _ntp_case()
    settings = json.loads(export(plan, "megatron", replan=replan).files["nonuniform_tp.json"])
    # GPU 3 (stage 0) and GPU 12 (stage 0, next domain) fail: two degraded TP8 groups packed in one replica
    assert (settings["tp_base"], settings["tp_spares"], settings["num_reduced_tp_dp_ranks"]) == (8, 1, 1)
    # the reduced replica comes first in Megatron's rank order; one inactive slot per stage
    assert sorted(settings["non_active_ranks_per_dp"]) == ["0,0,0", "0,0,1"]
    assert all(len(v) == 1 for v in settings["non_active_ranks_per_dp"].values())


# the dense layout every framework loader test varies (tests/ntp_planner/emitters/test_*_loader.py)
LOADER_DENSE = dict(tp=2, pp=2, dp=4, global_batch=16, sequence_parallel=True, distributed_optimizer=True)


def loader_variants() -> dict:
    """The variants of issue 25 every framework's loader test loads, on Llama 3 8B: vpp, cp, ZeRO-3,
    and fp8 with delayed and with current scaling; each test adds its MoE, frozen and own cases."""
    d = LOADER_DENSE
    plans = {
        "vpp": make("llama3-8b", 16, **{**d, "vpp": 2}),
        "cp": make("llama3-8b", 16, **{**d, "pp": 1, "cp": 2}),
        "zero3": make("llama3-8b", 16, **{**d, "pp": 1, "dp": 8, "zero": 3}),
    }
    for recipe in ("delayed", "current"):
        t = TrainingSpec(seq_len=4096, global_batch=16, dtype="fp8", fp8_recipe=recipe)
        plans[f"fp8-{recipe}"] = _plan(gpus=16, training=t, **d)
    return plans


# YaRN on a model whose framework recipe is not GPT-OSS's (Qwen3 0.6B's shape with the rope_scaling Qwen's model
# card gives for 131,072 tokens): every framework's loader test loads it beside the catalogue's GPT-OSS and
# DeepSeek-V3, whose published config.json files carry YaRN too (tests/cost_models/hf_configs/)
YARN_HF_CONFIGS = {
    "qwen3-yarn": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    },
}  # fmt: skip


def _catalogue_plan(name):
    m = MODELS[name]
    widths = [m.ffn_hidden_size] + ([m.moe_ffn_hidden_size] if m.is_moe else [])
    tp = next(
        t
        for t in (8, 4, 2, 1)
        if m.num_heads % t == 0
        and all(w % t == 0 for w in widths)
        and (m.num_kv_heads % t == 0 or t % m.num_kv_heads == 0)
    )
    dp = max(2, 8 // (2 * tp))
    return make(
        name,
        2 * tp * dp,
        seq=2048,
        tp=tp,
        pp=2,
        dp=dp,
        ep=2 if m.is_moe else 1,
        etp=1 if m.is_moe and m.bias else None,  # megatron-core: biased experts only at etp 1
        global_batch=8,
        sequence_parallel=tp > 1,
        distributed_optimizer=True,
    )


@pytest.mark.parametrize("name", list(MODELS))
def test_megatron_core_accepts_every_catalogue_plan(name):
    transformer = pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    import torch

    from tests.support.megatron_config import transformer_config

    plan = _catalogue_plan(name)
    args = megatron_args(plan, plan.layout)
    extra = {"pipeline_dtype": torch.bfloat16} if plan.layout.pp > 1 else {}
    config = transformer_config(args, **extra)  # MLATransformerConfig for an MLA model
    assert isinstance(config, transformer.TransformerConfig)
    assert config.num_layers == plan.model.num_layers
    assert config.tensor_model_parallel_size == plan.layout.tp
    assert bool(getattr(config, "multi_latent_attention", False)) == plan.model.is_mla
    if plan.model.is_moe:
        assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (2, plan.layout.expert_tp)
        assert config.moe_router_pre_softmax == (plan.model.moe_top_k == 1)


def test_megatron_core_rejects_a_broken_export():
    transformer = pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    plan = _catalogue_plan("llama3-8b")
    kwargs = transformer_config_kwargs(megatron_args(plan, plan.layout))
    kwargs["num_attention_heads"] = 31  # not divisible by tp: the check must be able to fail
    with pytest.raises(ValueError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformer.TransformerConfig(**kwargs)


@pytest.mark.parametrize("case", CASES)
def test_nemo_and_bridge_yaml_load_with_omegaconf(case):
    omegaconf = pytest.importorskip("omegaconf", reason="omegaconf is not installed")
    plan, _ = frozen(case)
    nemo = omegaconf.OmegaConf.create(export(plan, "nemo").files["nemo_config.yaml"])
    assert nemo.trainer.devices == 8 and nemo.trainer.num_nodes == plan.cluster.num_gpus // 8
    assert nemo.model.tensor_model_parallel_size == plan.layout.tp
    assert nemo.model.global_batch_size == plan.layout.global_batch
    bridge = omegaconf.OmegaConf.create(export(plan, "bridge").files["bridge_override.yaml"])
    assert bridge.train.micro_batch_size == plan.layout.micro_batch and bridge.dataset.seq_length == 4096
    assert bridge.ddp.use_distributed_optimizer is True
    assert bridge.model.pipeline_model_parallel_size == plan.layout.pp
    compile(export(plan, "nemo2").files["nemo2_recipe.py"], "nemo2_recipe.py", "exec")


def test_per_layer_plans_export_their_projection_with_a_warning():
    from ntp_planner.solver.planner import make_plan
    from ntp_planner.solver.search import SearchSpace

    plan = make_plan(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=8192, global_batch=256),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64),
        top=1,
        space=SearchSpace(zeros=(1,)),  # with ZeRO-2/3 a uniform layout wins here
    )
    assert plan.layout.is_per_layer
    out = export(plan, "megatron")
    args = json.loads(out.files["megatron_args.json"])
    assert args[args.index("--tensor-model-parallel-size") + 1] == str(plan.megatron.layout.tp)
    assert len(out.warnings) == 1 and "lower throughput" in out.warnings[0]


def test_script_is_shell_safe(tmp_path):
    odd = tmp_path / """it's "my model" v2"""
    odd.mkdir()
    (odd / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 4,
                "num_attention_heads": 16,
                "vocab_size": 32000,
            }
        )
    )
    plan_path, out = tmp_path / "plan.json", tmp_path / "launch dir"
    runner = CliRunner()
    made = runner.invoke(
        app,
        [
            "estimate",
            "-m",
            str(odd / "config.json"),
            "-c",
            "dgx-h100",
            "-n",
            "8",
            "--tp",
            "2",
            "--seq-len",
            "1024",
            "--global-batch",
            "8",
            "-o",
            str(plan_path),
        ],
    )
    assert made.exit_code == 0, made.output
    result = runner.invoke(
        app,
        [
            "export",
            str(plan_path),
            "--format",
            "megatron",
            "-o",
            str(out),
            "--data-path",
            "/data/my corpus; rm -rf $HOME `x`",
        ],
    )
    assert result.exit_code == 0, result.output
    script = out / "launch_megatron.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # run it with a stub torchrun that records the arguments it receives
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "torchrun").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (stub / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "MEGATRON_LM": "/opt/megatron"}
    ran = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=30)
    assert ran.returncode == 0, ran.stderr
    received = json.loads(ran.stdout)
    expected = json.loads((out / "megatron_args.json").read_text())
    assert received[received.index("/opt/megatron/pretrain_gpt.py") + 1 :] == expected
    assert """checkpoints/it's "my model" v2""" in expected


def test_export_bad_input(tmp_path):
    plan, replan = _ntp_case()
    path = tmp_path / "p.json"
    plan.save(path)
    runner = CliRunner()
    bad = runner.invoke(app, ["export", str(path), "--format", "deepspeed"])
    assert bad.exit_code == 2 and "'--format': Value error, 'deepspeed' is not one of" in bad.stderr
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    bad = runner.invoke(app, ["export", str(path), "-o", str(blocked / "sub")])
    assert bad.exit_code == 2 and f"{blocked} is a file, not a folder" in bad.stderr and "Traceback" not in bad.output
    wrong = tmp_path / "r.json"
    wrong.write_text("{}")
    bad = runner.invoke(app, ["export", str(path), "--replan", str(wrong)])
    assert bad.exit_code == 2 and "is not a re-plan" in bad.stderr


def _flag_values(args: list[str]) -> dict:
    values, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            values[args[i]] = args[i + 1]
            i += 2
        else:
            values[args[i]] = True
            i += 1
    return values


def _plan(model="llama3-8b", gpus=64, training=None, **layout):
    lay = ParallelLayout(**layout)
    t = training or TrainingSpec(seq_len=4096, global_batch=lay.global_batch)
    return plan_from_layout(MODELS[model], t, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus), lay)


@pytest.mark.parametrize(("zero", "strategy"), [(2, "optim_grads"), (3, "optim_grads_params")])
def test_zero_levels_export_as_megatron_fsdp(zero, strategy):
    plan = _plan(dp=64, global_batch=64, zero=zero)
    args = _flag_values(megatron_args(plan, plan.layout))
    assert args["--use-megatron-fsdp"] is True and args["--data-parallel-sharding-strategy"] == strategy
    assert args["--use-distributed-optimizer"] is True
    bridge = yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])
    assert bridge["ddp"]["data_parallel_sharding_strategy"] == strategy and bridge["dist"]["use_megatron_fsdp"]
    nemo = yaml.safe_load(export(plan, "nemo").files["nemo_config.yaml"])
    assert nemo["model"]["fsdp"] is True and nemo["model"]["fsdp_sharding_strategy"] == {2: "grad", 3: "full"}[zero]


def test_zero1_and_zero0_do_not_ask_for_fsdp():
    for zero, distopt in ((0, False), (1, True)):
        args = _flag_values(megatron_args(p := _plan(dp=64, global_batch=64, zero=zero), p.layout))
        assert "--use-megatron-fsdp" not in args and ("--use-distributed-optimizer" in args) == distopt


def test_keeping_parameters_after_forward_warns_that_megatron_fsdp_cannot():
    plan = _plan(dp=64, global_batch=64, zero=3, reshard_after_forward=False)
    assert any("reshard_after_forward" in w for w in export(plan, "megatron").warnings)


@pytest.mark.parametrize(("recipe", "fp8_recipe_flag"), [("delayed", "delayed"), ("current", "tensorwise")])
def test_fp8_exports_its_recipe_and_keeps_gradients_in_bf16(recipe, fp8_recipe_flag):
    t = TrainingSpec(seq_len=4096, global_batch=64, dtype="fp8", fp8_recipe=recipe, fp8_params=True)
    plan = _plan(training=t, dp=64, global_batch=64, zero=1)
    args = _flag_values(megatron_args(plan, plan.layout))
    assert args["--bf16"] is True and args["--fp8-format"] == "hybrid" and args["--fp8-recipe"] == fp8_recipe_flag
    assert args["--fp8-param-gather"] is True and args["--grad-reduce-in-bf16"] is True
    exported = export(plan, "bridge")
    bridge = yaml.safe_load(exported.files["bridge_override.yaml"])
    # Bridge takes a mixed-precision recipe by name; its fp8 recipes reduce gradients in fp32,
    # unlike this plan, and the export says so
    assert bridge["mixed_precision"] == f"bf16_with_fp8_{'delayed' if recipe == 'delayed' else 'current'}_scaling_mixed"
    assert any("reduces gradients in fp32, unlike the plan (16-bit" in w for w in exported.warnings)


def test_blackwell_formats_export_and_nemo1_says_it_cannot():
    t = TrainingSpec(seq_len=4096, global_batch=64, dtype="mxfp8")
    lay = ParallelLayout(dp=64, global_batch=64, zero=1)
    plan = plan_from_layout(MODELS["llama3-8b"], t, Cluster(spec=CLUSTERS["dgx-b200"], num_gpus=64), lay)
    args = _flag_values(megatron_args(plan, plan.layout))
    assert (args["--fp8-format"], args["--fp8-recipe"]) == ("e4m3", "mxfp8")
    assert any("NeMo 1.x has no mxfp8" in w for w in export(plan, "nemo").warnings)
    fp4 = plan.model_copy(update={"training": t.model_copy(update={"dtype": "nvfp4"})})
    args = _flag_values(megatron_args(fp4, fp4.layout))
    assert (args["--fp4-format"], args["--fp4-recipe"]) == ("e2m1", "nvfp4")


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        # 405B at pp8 vpp8 with the embedding and the loss counted: Megatron's own flags
        (
            dict(chunk_layers=(1,) + (2,) * 62 + (1,)),
            {"--account-for-embedding-in-pipeline-split": True, "--account-for-loss-in-pipeline-split": True},
        ),
        # an equal split: only the number of virtual stages
        (dict(chunk_layers=None), {"--num-virtual-stages-per-pipeline-rank": "8"}),
        # anything else: the layout string, chunk by chunk
        (dict(chunk_layers=(2,) * 62 + (1, 1)), {"--pipeline-model-parallel-layout": None}),
    ],
)
def test_pipeline_splits_export_as_megatron_writes_them(split, expected):
    m = MODELS["llama3.1-405b"]
    model = m.model_copy(update={"num_layers": 128}) if split["chunk_layers"] is None else m
    lay = ParallelLayout(tp=8, pp=8, dp=1, vpp=8, global_batch=8, sequence_parallel=True, **split)
    plan = plan_from_layout(
        model, TrainingSpec(seq_len=4096, global_batch=8), Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64), lay
    )
    args = _flag_values(megatron_args(plan, plan.layout))
    for flag, value in expected.items():
        assert flag in args and (value is None or args[flag] == value)
    if "--pipeline-model-parallel-layout" in expected:
        from cost_models.pipeline_layout import parse_layout

        assert parse_layout(args["--pipeline-model-parallel-layout"], 8) == split["chunk_layers"]


def test_megatron_core_accepts_the_account_for_flags():
    transformer = pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    import torch

    m = MODELS["llama3.1-405b"]
    lay = ParallelLayout(
        tp=8, pp=8, dp=1, vpp=8, global_batch=8, sequence_parallel=True, chunk_layers=(1,) + (2,) * 62 + (1,)
    )
    plan = plan_from_layout(
        m, TrainingSpec(seq_len=4096, global_batch=8), Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64), lay
    )
    kwargs = transformer_config_kwargs(megatron_args(plan, plan.layout))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformer.TransformerConfig(**kwargs, pipeline_dtype=torch.bfloat16)
    assert config.account_for_embedding_in_pipeline_split and config.virtual_pipeline_model_parallel_size == 8


def test_megatron_core_accepts_a_layout_string_and_builds_its_chunks():
    transformer = pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    import torch

    m = MODELS["llama3-70b"]
    chunks = (2,) * 35 + (3,) + (2,) * 3 + (1,)  # Megatron-Bridge's H100 recipe at GBS 256
    lay = ParallelLayout(tp=4, pp=8, dp=2, vpp=5, global_batch=16, sequence_parallel=True, chunk_layers=chunks)
    plan = plan_from_layout(
        m, TrainingSpec(seq_len=4096, global_batch=16), Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64), lay
    )
    kwargs = transformer_config_kwargs(megatron_args(plan, plan.layout))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformer.TransformerConfig(**kwargs, pipeline_dtype=torch.bfloat16)
    from megatron.core.transformer.enums import LayerType

    grid = config.pipeline_model_parallel_layout.layout  # [pp rank][virtual stage] -> layer types
    # megatron-core's own parser puts the same transformer layers in each chunk, chunk c on rank c % pp
    assert [grid[c % 8][c // 8].count(LayerType.decoder) for c in range(40)] == list(chunks)
    assert grid[0][0][0] == LayerType.embedding and grid[7][4][-1] == LayerType.loss


# ---- issue 22: hostile values reach the program as one argument each -------------------------------
HOSTILE = [
    "--x; touch PWNED; :",  # a leading dash and a command after ;
    "$(touch PWNED)",
    "`touch PWNED`",
    """it's "quoted" \\ and 'single'""",
    "line one\nline two; touch PWNED",
    "-",
    "  spaced  ",
    "*",
    "~/data",
    "a\tb | touch PWNED &",
]


def _stub_bin(folder: Path) -> dict:
    """PATH and MEGATRON_LM for a stub torchrun that prints its argument vector as JSON."""
    stub = folder / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "torchrun").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (stub / "torchrun").chmod(0o755)
    return {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "MEGATRON_LM": "/opt/megatron"}


def _value_of(argv: list[str], flag: str) -> str:
    """The value ``flag`` carries in ``argv``: the next word, or after '=' in one ``--flag=value`` word."""
    joined = [a for a in argv if a.startswith(flag + "=")]
    return joined[0][len(flag) + 1 :] if joined else argv[argv.index(flag) + 1]


@pytest.mark.parametrize("value", HOSTILE)
def test_every_script_value_reaches_the_launcher_unchanged(tmp_path, value):
    plan, _ = frozen("dense_pp_interleaved")
    plan_path, out = tmp_path / "plan.json", tmp_path / "out"
    plan.save(plan_path)
    argv = ["export", str(plan_path), "-o", str(out), "--data-path", value, "--save-dir", value + "/ckpt"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    env = _stub_bin(tmp_path)
    ran = subprocess.run(["bash", str(out / "launch_megatron.sh")], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=30)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    received = json.loads(ran.stdout)
    assert not (tmp_path / "PWNED").exists()
    program = received[received.index("/opt/megatron/pretrain_gpt.py") + 1 :]
    assert program == json.loads((out / "megatron_args.json").read_text())
    assert _value_of(program, "--data-path") == value
    assert _value_of(program, "--save") == _value_of(program, "--load") == value + "/ckpt"
    dashed = value.startswith("-")  # argparse would take a separate '--x' for an option
    assert (f"--data-path={value}" in program) == dashed and ("--mock-data" not in program)
    # the rest of the vector is the plan's, word for word
    ours = {value, f"{value}/ckpt", "--data-path", "--save", "--load"}
    ours |= {f"--data-path={value}", f"--save={value}/ckpt", f"--load={value}/ckpt"}
    rest = [a for a in program if a not in ours]
    assert rest == [a for a in megatron_args(plan, plan.layout) if a not in ("--mock-data", "--save", "--load")
                    and not a.startswith("checkpoints/")]  # fmt: skip


def test_launch_script_quotes_each_word_on_its_own():
    # the old script paired a flag with the next word unless it started with "--": a value that
    # did went in bare; now every word is quoted whatever comes before it
    from ntp_planner.emitters.megatron import launch_script

    plan, _ = frozen("dense_pp_interleaved")
    script = launch_script(plan, ["--data-path", "--x; touch PWNED; :", "--mock-data"])
    assert "    --data-path \\\n    '--x; touch PWNED; :' \\\n    --mock-data\n" in script


@pytest.mark.parametrize("fmt", ["nemo", "nemo2", "bridge", "json"])
def test_replan_is_refused_by_every_target_but_megatron(tmp_path, fmt):
    plan, replan = frozen("ntp_replanned")
    plan_path, replan_path = tmp_path / "plan.json", tmp_path / "r.json"
    plan.save(plan_path)
    replan_path.write_text(replan.model_dump_json())
    argv = ["export", str(plan_path), "--format", fmt, "--replan", str(replan_path), "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"error: --replan: {fmt} cannot express a re-planned state")
    assert not (tmp_path / "out").exists()
    ok = CliRunner().invoke(app, [*argv[:3], "megatron", *argv[4:]])
    assert ok.exit_code == 0 and (tmp_path / "out" / "nonuniform_tp.json").exists()


def _nemo2_configure(text: str):
    """Run the exported recipe's configure() on a stand-in recipe, with stand-in nemo modules;
    returns the recipe and the data module config it built."""
    import types

    built = {}

    class Config:
        def __init__(self, target, **kwargs):
            built.update(target=target, **kwargs)
            self.__dict__.update(kwargs)

    ns = types.SimpleNamespace
    llm = ns(PreTrainingDataModule="PreTrainingDataModule")
    fake = {"nemo": ns(), "nemo.collections": ns(llm=llm), "nemo_run": ns(Config=Config)}
    recipe = ns(
        trainer=ns(strategy=ns(ddp=ns()), plugins=ns()), model=ns(config=ns()), data=ns(tokenizer="tok"), log=ns()
    )
    saved = {k: sys.modules.get(k) for k in fake}
    sys.modules.update(fake)
    try:
        scope: dict = {}
        exec(compile(text, "nemo2_recipe.py", "exec"), scope)  # noqa: S102  (our own export, to run it)
        scope["configure"](recipe)
    finally:
        for k, v in saved.items():
            sys.modules.pop(k) if v is None else sys.modules.__setitem__(k, v)
    return recipe, built


@pytest.mark.parametrize("value", ["/data/corpus_text_document", HOSTILE[3], HOSTILE[4]])
def test_data_path_and_save_dir_reach_every_target_that_has_the_field(value):
    plan, _ = frozen("dense_pp_interleaved")
    nemo = yaml.safe_load(export(plan, "nemo", data_path=value, save_dir=value).files["nemo_config.yaml"])
    assert nemo["model"]["data"]["data_prefix"] == [value] and nemo["exp_manager"]["exp_dir"] == value
    bridge = yaml.safe_load(export(plan, "bridge", data_path=value, save_dir=value).files["bridge_override.yaml"])
    assert bridge["dataset"]["data_path"] == value and bridge["checkpoint"]["save"] == value
    recipe, data = _nemo2_configure(export(plan, "nemo2", data_path=value, save_dir=value).files["nemo2_recipe.py"])
    assert data == {"target": "PreTrainingDataModule", "paths": [value], "tokenizer": "tok"}
    assert recipe.log.log_dir == value and recipe.data.global_batch_size == plan.layout.global_batch
    plain, _ = _nemo2_configure(export(plan, "nemo2").files["nemo2_recipe.py"])
    assert not hasattr(plain.log, "log_dir") and plain.data.tokenizer == "tok"  # the recipe's own data module


@pytest.mark.parametrize(("option", "field"), [("--data-path", "data path"), ("--save-dir", "checkpoint folder")])
def test_json_export_refuses_paths_it_has_no_field_for_and_empty_paths_are_refused(tmp_path, option, field):
    plan, _ = frozen("moe")
    path = tmp_path / "plan.json"
    plan.save(path)
    result = CliRunner().invoke(app, ["export", str(path), "--format", "json", option, "/x", "-o", str(tmp_path)])
    assert result.exit_code == 2 and f"error: {option}: the json export holds the layout only and has no {field}" in (
        result.stderr
    )
    empty = CliRunner().invoke(app, ["export", str(path), option, "", "-o", str(tmp_path / "e")])
    assert empty.exit_code == 2 and f"error: {option} '' is empty" in empty.stderr
    assert not (tmp_path / "e").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_format_the_clusters_gpu_cannot_run_is_refused_by_every_target():
    plan = _plan(dp=64, global_batch=64, zero=1)  # H100: fp16, bf16, fp8 tensor cores
    fp4 = plan.model_copy(update={"training": plan.training.model_copy(update={"dtype": "nvfp4"})})
    for fmt in FORMATS:
        with pytest.raises(InputError, match=r"trains in nvfp4 but the cluster's H100-SXM \(hopper\) has no nvfp4"):
            export(fp4, fmt)
    mx = plan.model_copy(update={"training": plan.training.model_copy(update={"dtype": "mxfp8"})})
    with pytest.raises(InputError, match="it runs fp16, bf16, fp8"):
        export(mx, "nemo2")
    assert export(plan, "nemo2").files  # bf16 on the same GPU exports


@pytest.mark.parametrize("case", CASES)
def test_every_exported_file_is_one_its_target_lists(case):
    # an export replaces an earlier export of its target whole only if it knows all of its names
    from ntp_planner.emitters import EXPORT_FILES

    plan, replan = frozen(case)
    for fmt in FORMATS:
        if (case, fmt) in REFUSED:
            continue
        names = export(plan, fmt, replan=replan if fmt == "megatron" else None).files
        assert set(names) <= set(EXPORT_FILES[fmt]) and names
    plan, replan = _ntp_case()
    assert set(export(plan, "megatron", replan=replan).files) == set(EXPORT_FILES["megatron"])


# ---- experts and attention variants: megatron-core's own config classes read the exports ----------


def _variant(base: str, **fields):
    m = MODELS[base]
    return type(m).model_validate({**m.model_dump(), "name": f"{base}-variant", **fields})  # validated


def _moe_plan(cluster="dgx-h100", model="deepseek-moe-16b", **layout):
    """deepseek-moe-16b (64 experts top-6, first layer dense, a 2,816-wide shared expert) on 16
    GPUs, its experts folded: etp 1, ep 4 over tp 2 x dp 4, interleaved pp 2."""
    fields = dict(tp=2, pp=2, dp=4, vpp=2, ep=4, etp=1, global_batch=16, sequence_parallel=True)
    lay = ParallelLayout(**{**fields, **layout})
    m = MODELS[model] if isinstance(model, str) else model
    return plan_from_layout(
        m, TrainingSpec(seq_len=4096, global_batch=16), Cluster(spec=CLUSTERS[cluster], num_gpus=16), lay
    )


@pytest.mark.parametrize(("cluster", "backend"), [("dgx-h100", "deepep"), ("gb200-nvl72", "hybridep")])
def test_megatron_core_builds_a_folded_moe_export(cluster, backend):
    pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    import torch

    from tests.support.megatron_config import transformer_config

    plan = _moe_plan(cluster, moe_dispatcher="flex", moe_overlap="1f1b")
    args = megatron_args(plan, plan.layout)
    config = transformer_config(args, pipeline_dtype=torch.bfloat16)
    assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (4, 1)
    assert (config.tensor_model_parallel_size, config.num_moe_experts, config.moe_router_topk) == (2, 64, 6)
    assert config.moe_token_dispatcher_type == "flex" and config.moe_flex_dispatcher_backend == backend
    assert config.overlap_moe_expert_parallel_comm and config.moe_grouped_gemm
    assert config.moe_layer_freq == [0] + [1] * 27  # HF first_k_dense_replace 1 of 28 layers
    assert config.moe_shared_expert_intermediate_size == 2816 and config.moe_ffn_hidden_size == 1408
    unfolded = _moe_plan(cluster, etp=None)
    config = transformer_config(megatron_args(unfolded, unfolded.layout), pipeline_dtype=torch.bfloat16)
    assert config.expert_tensor_parallel_size == 2 and config.moe_token_dispatcher_type == "alltoall"
    assert not config.overlap_moe_expert_parallel_comm


@pytest.mark.parametrize(
    ("layout", "rule"),
    [
        (dict(recompute="full"), "full recomputation"),
        (dict(vpp=1), "virtual pipeline"),
        (dict(moe_dispatcher="allgather"), "allgather dispatcher"),
        (dict(ep=1, etp=None), "expert parallelism"),
    ],
)
def test_a2a_overlap_megatron_refuses_is_dropped_with_its_rule(layout, rule):
    pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    import torch

    from tests.support.megatron_config import transformer_config

    plan = _moe_plan(moe_overlap="1f1b", **layout)
    args = megatron_args(plan, plan.layout)
    assert "--overlap-moe-expert-parallel-comm" not in args
    notes = export(plan, "megatron").warnings
    assert any("A2A overlap is not exported" in w and rule in w for w in notes), notes
    transformer_config(args, pipeline_dtype=torch.bfloat16)  # builds without the flag
    with pytest.raises((AssertionError, ValueError)):  # megatron-core itself refuses the flag here
        transformer_config([*args, "--overlap-moe-expert-parallel-comm"], pipeline_dtype=torch.bfloat16)


def test_dualpipe_exports_as_the_1f1b_overlap_with_a_note():
    plan = _moe_plan(moe_overlap="dualpipe")
    out = export(plan, "megatron")
    assert "--overlap-moe-expert-parallel-comm" in json.loads(out.files["megatron_args.json"])
    assert any("no DualPipe" in w for w in out.warnings)
    said = [w for w in out.warnings if "no load-balancing loss weight" in w]
    assert len(said) == (1 if plan.model.moe_aux_loss_coeff is None else 0)  # a model without one: said so


@pytest.mark.parametrize("q_lora_rank", [0, 1536])
def test_megatron_core_builds_an_mla_and_mtp_export(q_lora_rank):
    """DeepSeek-V3's attention (kv_lora_rank 512, 128 no-rope + 64 rope query/key dims, 128-wide
    values, one MTP layer) on deepseek-moe-16b: megatron-core's MLATransformerConfig."""
    transformer = pytest.importorskip("megatron.core.transformer.transformer_config", reason="no megatron-core")
    import torch

    from tests.support.megatron_config import transformer_config

    mla = dict(q_lora_rank=q_lora_rank, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    plan = _moe_plan(model=_variant("deepseek-moe-16b", head_dim=192, mtp_layers=1, **mla))
    config = transformer_config(megatron_args(plan, plan.layout), pipeline_dtype=torch.bfloat16)
    assert isinstance(config, transformer.MLATransformerConfig) and config.multi_latent_attention
    assert config.q_lora_rank == (q_lora_rank or None) and config.kv_lora_rank == 512
    assert (config.qk_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim) == (128, 64, 128)
    assert config.mtp_num_layers == 1
    bridge = yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])["model"]
    assert bridge["multi_latent_attention"] and bridge["kv_lora_rank"] == 512 and bridge["mtp_num_layers"] == 1
    nemo = export(plan, "nemo")
    assert "multi_latent_attention" not in yaml.safe_load(nemo.files["nemo_config.yaml"])["model"]
    assert any("multi_latent_attention dropped" in w for w in nemo.warnings)


@pytest.mark.parametrize("every", [2, 0, 3])
def test_megatron_core_windows_the_layers_the_model_windows(every):
    """GPT-OSS's attention (a 128-token window on every other layer, sinks) on mixtral-8x7b:
    megatron-core's own is_layer_window_attention picks the layers ModelSpec's rule windows."""
    pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    from megatron.core.transformer.utils import is_layer_window_attention

    from tests.support.megatron_config import transformer_config

    m = _variant("mixtral-8x7b", sliding_window=128, full_attention_every=every, attention_sinks=True)
    plan = _moe_plan(model=m, ep=8, etp=1, vpp=1, pp=1, dp=8)
    config = transformer_config(megatron_args(plan, plan.layout))
    assert config.window_size == (127, 0) and config.softmax_type == "learnable"
    windowed = [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, i + 1) for i in range(32)]
    full = [every > 0 and (i + 1) % every == 0 for i in range(32)]  # the ModelSpec field's stated rule
    assert windowed == [not f for f in full] and any(windowed)
    nemo2 = export(plan, "nemo2").files["nemo2_recipe.py"]
    assert "recipe.model.config.window_size = (127, 0)" in nemo2
    assert "recipe.model.config.softmax_type = 'learnable'" in nemo2


def test_nemo1_drops_what_it_cannot_run_and_says_so():
    plan = _moe_plan(moe_dispatcher="flex")
    out = export(plan, "nemo")
    model = yaml.safe_load(out.files["nemo_config.yaml"])["model"]
    assert model["moe_token_dispatcher_type"] == "alltoall" and "moe_flex_dispatcher_backend" not in model
    assert "expert_tensor_parallel_size" not in model and model["expert_model_parallel_size"] == 4
    assert any("moe_flex_dispatcher_backend dropped, moe_token_dispatcher_type alltoall" in w for w in out.warnings)
    assert any("expert_tensor_parallel_size dropped" in w for w in out.warnings)  # etp 1: a folding NeMo 1 lacks
    recipe = export(plan, "nemo2").files["nemo2_recipe.py"]
    assert "strategy.expert_tensor_parallel_size = 1" in recipe
    assert "recipe.model.config.moe_flex_dispatcher_backend = 'deepep'" in recipe


@pytest.mark.parametrize("variant", ["folded", "mla", "window"])
def test_nemo2_and_bridge_model_keys_are_megatron_core_config_fields(variant):
    """Every model.* key of the Bridge override and every recipe.model.config.* / strategy field
    the NeMo 2 recipe sets for experts and attention is a field of megatron-core's own config
    dataclass (Bridge's providers and NeMo 2's configs subclass it): a misspelt name fails here."""
    import dataclasses
    import re

    pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    names = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    models = {
        "folded": MODELS["deepseek-moe-16b"],
        "mla": _variant(
            "deepseek-moe-16b",
            head_dim=192,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
        ),
        "window": _variant("mixtral-8x7b", sliding_window=4096, full_attention_every=4, attention_sinks=True),
    }
    plan = _moe_plan(model=models[variant], moe_dispatcher="flex", moe_overlap="1f1b")
    bridge = yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])["model"]
    # GPTModelProvider's own fields, beside TransformerConfig's
    provider = {"seq_length", "position_embedding_type", "share_embeddings_and_output_weights", "vocab_size"}
    assert set(bridge) - names == provider, set(bridge) - names
    recipe = export(plan, "nemo2").files["nemo2_recipe.py"]
    compile(recipe, "nemo2_recipe.py", "exec")
    config_keys = set(re.findall(r"recipe\.model\.config\.(\w+) =", recipe))
    assert config_keys and config_keys <= names, config_keys - names
    assert {"moe_token_dispatcher_type", "overlap_moe_expert_parallel_comm"} <= config_keys
    strategy_keys = set(re.findall(r"strategy\.(\w+_size) =", recipe))
    assert {"expert_model_parallel_size", "expert_tensor_parallel_size"} <= strategy_keys <= names


@pytest.mark.parametrize("case", CASES)
def test_megatron_core_builds_every_frozen_export(case):
    """megatron-core's own config from each frozen plan's Megatron-LM arguments (DeepSeek-V3
    folded, with MLA and an MTP module in its pipeline layout string included)."""
    pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    import torch
    from megatron.core.transformer.enums import LayerType

    from tests.support.megatron_config import transformer_config

    plan, _ = frozen(case)
    args = json.loads(export(plan, "megatron").files["megatron_args.json"])
    config = transformer_config(args, pipeline_dtype=torch.bfloat16)
    lay, m = plan.layout, plan.model
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (lay.tp, lay.pp)
    assert (config.mtp_num_layers or 0) == m.mtp_layers
    if m.is_moe:
        assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (lay.ep, lay.expert_tp)
    if config.pipeline_model_parallel_layout is not None:
        grid = config.pipeline_model_parallel_layout.layout  # [pp rank][virtual stage] -> layer types
        flat = [t for chunk in zip(*grid, strict=True) for stage in chunk for t in stage]
        assert flat.count(LayerType.decoder) == m.num_layers and flat.count(LayerType.mtp) == m.mtp_layers
        assert grid[-1][-1][-2:] == ([LayerType.mtp, LayerType.loss] if m.mtp_layers else grid[-1][-1][-2:])


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("llama3-8b", {"--rotary-base": "500000", "--norm-epsilon": "1e-05"}),
        ("llama3.1-405b", {"--rotary-base": "500000", "--use-rope-scaling": True, "--rope-scaling-factor": "8"}),
        ("mixtral-8x7b", {"--rotary-base": "1000000", "--moe-aux-loss-coeff": "0.02"}),
        ("qwen3-30b-a3b", {"--norm-epsilon": "1e-06", "--moe-aux-loss-coeff": "0.001"}),
        (
            "deepseek-v3",
            {
                "--moe-router-score-function": "sigmoid",
                "--moe-router-enable-expert-bias": True,
                "--rotary-base": "10000",
            },
        ),
    ],
)
def test_megatron_builds_the_model_its_authors_wrote(name, expect):
    """The rotary base and scaling, the norm epsilon and the router's settings travel with the
    export (issue 25): Megatron's defaults (rotary base 10,000, aux loss 0, softmax routing)
    would build another model. megatron-core's own config takes the fields."""
    transformer = pytest.importorskip("megatron.core.transformer", reason="megatron-core is not installed")
    import torch

    from tests.support.megatron_config import transformer_config

    plan = _catalogue_plan(name)
    args = megatron_args(plan, plan.layout)
    for flag, value in expect.items():
        assert flag in args
        if value is not True:
            assert args[args.index(flag) + 1] == value
    config = transformer_config(args, pipeline_dtype=torch.bfloat16)
    assert isinstance(config, transformer.TransformerConfig)
    m = plan.model
    assert config.layernorm_epsilon == m.norm_eps
    if m.is_moe:
        assert config.moe_aux_loss_coeff == (m.moe_aux_loss_coeff or 0.0)  # unset: megatron-core's 0
        assert config.moe_router_score_function == m.moe_router_score_function
        assert config.moe_router_enable_expert_bias == m.moe_router_expert_bias


def test_qwen2_keeps_its_qkv_bias_and_a_model_without_settings_exports_none():
    from cost_models.hf_config import model_from_hf_config

    cfg = {
        "model_type": "qwen2", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
        "num_key_value_heads": 2, "intermediate_size": 2816, "vocab_size": 4096, "rope_theta": 1e6,
        "rms_norm_eps": 1e-6, "hidden_act": "silu",
    }  # fmt: skip
    m = model_from_hf_config(cfg, "qwen2-tiny")
    assert (m.qkv_bias, m.bias, m.rope_theta, m.norm_eps) == (True, False, 1e6, 1e-6)
    from ntp_planner.emitters.moe import model_fields

    assert model_fields(m) == {"rotary_base": 1000000, "layernorm_epsilon": 1e-6, "add_qkv_bias": True}
    bare = model_from_hf_config(
        {k: v for k, v in cfg.items() if k not in ("rope_theta", "rms_norm_eps", "model_type")}, "x"
    )
    assert model_fields(bare) == {}


def test_nonuniform_tp_file_holds_megatrons_config_fields_and_loads_with_tuple_keys(tmp_path):
    """nonuniform_tp.json has NonuniformTPConfig's fields and no others; its loader turns the
    "dp,cp,pp" keys into Megatron's (dp, cp, pp) tuples. megatron-core 0.16 has no
    nonuniform_tp module (it is on Megatron-LM's dev branch), so the field names here are
    read from that file, the one place this test copies a schema."""
    import dataclasses
    import importlib.util
    import types

    plan, replan = _ntp_case()
    files = export(plan, "megatron", replan=replan).files
    for name in ("nonuniform_tp.json", "nonuniform_tp_config.py"):
        (tmp_path / name).write_text(files[name])

    @dataclasses.dataclass
    class NonuniformTPConfig:  # Megatron-LM dev, megatron/core/distributed/nonuniform_tp.py
        tp_base: int = 8
        tp_spares: int = 0
        num_reduced_tp_dp_ranks: int = 1
        non_active_ranks_per_dp: dict | None = None

    stand_in = types.ModuleType("megatron.core.distributed.nonuniform_tp")
    stand_in.NonuniformTPConfig = NonuniformTPConfig
    spec = importlib.util.spec_from_file_location("ntp_loader", tmp_path / "nonuniform_tp_config.py")
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "megatron.core.distributed.nonuniform_tp", stand_in)
        config = loader.ntp_config()
    assert (config.tp_base, config.tp_spares, config.num_reduced_tp_dp_ranks) == (8, 1, 1)
    assert sorted(config.non_active_ranks_per_dp) == [(0, 0, 0), (0, 0, 1)]
    assert all(isinstance(k, tuple) and all(isinstance(i, int) for i in k) for k in config.non_active_ranks_per_dp)


def test_gemmas_gelu_gate_is_not_exported_as_swiglu():
    """Gemma's GeGLU (issue 25): Megatron-LM's command line gates with quick GELU (said in a
    warning), NeMo 1 with its fast-geglu; a SwiGLU model keeps --swiglu and fast-swiglu."""
    from cost_models.hf_config import model_from_hf_config

    cfg = {
        "model_type": "gemma", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 4096,
        "hidden_act": "gelu_pytorch_tanh",
    }  # fmt: skip
    gemma = model_from_hf_config(cfg, "gemma-tiny")
    silu = model_from_hf_config({**cfg, "hidden_act": "silu"}, "silu-tiny")
    assert (gemma.gate_activation, silu.gate_activation) == ("gelu", "silu")
    lay = dict(tp=1, pp=1, dp=8, global_batch=8)
    for m, flag, other, act in (
        (gemma, "--quick-geglu", "--swiglu", "fast-geglu"),
        (silu, "--swiglu", "--quick-geglu", "fast-swiglu"),
    ):
        plan = make(m, 8, **lay)
        out = export(plan, "megatron")
        args = json.loads(out.files["megatron_args.json"])
        assert flag in args and other not in args
        assert any("no GELU-gated MLP" in w for w in out.warnings) == (m is gemma)
        assert yaml.safe_load(export(plan, "nemo").files["nemo_config.yaml"])["model"]["activation"] == act


def test_each_target_says_which_versions_it_is_for(tmp_path):
    """Issue 25 item 3: every export's header and `ntp export --help` name the versions; NeMo 2.x
    (nemo.collections.llm) stops at nemo-toolkit 2.7, NeMo 3 is Megatron-Bridge."""
    plan, _ = frozen("dense_pp_interleaved")
    heads = {fmt: "\n".join(next(iter(export(plan, fmt).files.values())).splitlines()[:6]) for fmt in FORMATS}
    assert "megatron-core 0.19.2" in heads["megatron"]
    assert "NeMo 1.x (nemo-toolkit 1.x" in heads["nemo"] and "NeMo 3: --format bridge" in heads["nemo"]
    assert "nemo-toolkit 2.0 to 2.7" in heads["nemo2"] and "NeMo 3: --format bridge" in heads["nemo2"]
    assert "Megatron-Bridge 0.3 recipes, which NeMo 3 (nemo-toolkit 3.0)" in heads["bridge"]
    assert "torchtitan 0.3" in heads["torchtitan"]
    help_text = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "120"}).output
    for line in (
        "nemo        NeMo 1.x",
        "nemo2       NeMo 2.x (nemo-toolkit 2.0 to 2.7",
        "NeMo 3 (nemo-toolkit 3.0)",
    ):
        assert line in help_text


def test_nemo1_refuses_fsdp_with_pipeline_parallelism(tmp_path):
    """NeMo 1.x asserts that FSDP runs without pipeline parallelism: the export says so in one
    sentence (exit 2), and the same plan at pp 1 exports."""
    bad = make("llama3-8b", 16, tp=2, pp=2, dp=4, global_batch=16, zero=3)
    with pytest.raises(InputError, match=r"NeMo 1.x runs FSDP \(this plan's ZeRO-3\) only without pipeline"):
        export(bad, "nemo")
    bad.save(tmp_path / "plan.json")
    out = CliRunner().invoke(app, ["export", str(tmp_path / "plan.json"), "--format", "nemo", "-o", str(tmp_path)])
    assert out.exit_code == 2 and "has pp 2" in out.output and "Traceback" not in out.output
    good = make("llama3-8b", 16, tp=2, pp=1, dp=8, global_batch=16, zero=3)
    assert yaml.safe_load(export(good, "nemo").files["nemo_config.yaml"])["model"]["fsdp"] is True


def test_an_unfused_rope_plan_is_exported_unfused_to_every_megatron_target():
    # TrainingSpec.rope_fusion False (GPT-OSS's YaRN: Megatron-Bridge's provider turns the fusion off, and the
    # cost model charges the unfused rotation, flops.unfused_rotary): Megatron-LM's --no-rope-fusion (dest
    # apply_rope_fusion, on by default in its arguments), apply_rope_fusion false in Bridge's model overrides,
    # on NeMo 2's recipe.model.config and under NeMo 1's model.*; a fused plan leaves each recipe's own default
    d = dict(tp=1, dp=8, global_batch=16)
    fused = _plan(gpus=8, **d)
    unfused = _plan(gpus=8, training=fused.training.model_copy(update={"rope_fusion": False}), **d)
    assert fused.inputs_hash != unfused.inputs_hash
    for plan, off in ((fused, False), (unfused, True)):
        args = megatron_args(plan, plan.layout)
        assert ("--no-rope-fusion" in args) is off and "--rope-fusion" not in args
        bridge = yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])["model"]
        nemo = yaml.safe_load(export(plan, "nemo").files["nemo_config.yaml"])["model"]
        recipe, _ = _nemo2_configure(export(plan, "nemo2").files["nemo2_recipe.py"])
        got = [
            bridge.get("apply_rope_fusion"),
            nemo.get("apply_rope_fusion"),
            vars(recipe.model.config).get("apply_rope_fusion"),
        ]
        assert got == ([False] * 3 if off else [None] * 3)
    mcore = pytest.importorskip("megatron.core.transformer.transformer_config", reason="megatron-core is not installed")
    import dataclasses

    assert "apply_rope_fusion" in {f.name for f in dataclasses.fields(mcore.TransformerConfig)}


def test_the_plans_flex_backend_is_exported_and_none_keeps_the_clusters_rule():
    # TrainingSpec.moe_flex_backend: a recipe's HybridEP on an 8-GPU DGX host (Megatron-Bridge's Qwen3-30B-A3B)
    # reaches --moe-flex-dispatcher-backend and Bridge's model overrides; None is the cluster's rule (DeepEP on a
    # DGX), and the hash leaves the field out at None (plans saved before it keep their hash)
    auto = _moe_plan(moe_dispatcher="flex")
    dgx = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    with_backend = lambda b: auto.training.model_copy(update={"moe_flex_backend": b})  # noqa: E731
    hybrid = plan_from_layout(auto.model, with_backend("hybridep"), dgx, auto.layout)
    deep = plan_from_layout(auto.model, with_backend("deepep"), dgx, auto.layout)
    assert len({auto.inputs_hash, hybrid.inputs_hash, deep.inputs_hash}) == 3
    assert "moe_flex_backend" not in auto.training.model_dump(exclude_defaults=True)
    got = {}
    for name, plan in (("auto", auto), ("hybrid", hybrid), ("deep", deep)):
        flags = _flag_values(megatron_args(plan, plan.layout))
        bridge = yaml.safe_load(export(plan, "bridge").files["bridge_override.yaml"])["model"]
        got[name] = (flags["--moe-flex-dispatcher-backend"], bridge["moe_flex_dispatcher_backend"])
    assert got == {"auto": ("deepep",) * 2, "hybrid": ("hybridep",) * 2, "deep": ("deepep",) * 2}
