"""The torchtitan export, read back by torchtitan 0.3.0's own ConfigManager, with the arguments the
exported launch script gives ``torchtitan.train`` (not by a copy of its schema), and checked against
the plan's numbers, worked out by hand below."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.efficiency import DEFAULT_EFFICIENCY
from ntp_planner.cli import app
from ntp_planner.emitters import EXPORT_FILES, export
from ntp_planner.emitters.torchtitan import MODELS as TITAN_MODELS
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster
from topologies.errors import InputError

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="torchtitan 0.3.0 needs Python 3.11")
# The tests that read an export with torchtitan itself run in `make test-slow`, which installs
# torchtitan and what it imports (triton among them: a 286 MB wheel that `make test` skips).
TITAN = pytest.mark.slow
FROZEN = Path(__file__).parents[1] / "plans"


TITAN_RUNTIME = DEFAULT_EFFICIENCY.with_profile(None, "torchtitan")  # plans costed for torchtitan: no runtime warning


def _plan(model="llama3-8b", gpus=64, training=None, **layout):
    lay = ParallelLayout(**layout)
    m = MODELS[model] if isinstance(model, str) else model
    t = training or TrainingSpec(seq_len=4096, global_batch=lay.global_batch)
    return plan_from_layout(m, t, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus), lay, efficiency=TITAN_RUNTIME)


def _launch_args(script: str) -> list[str]:
    """What the launch script passes to ``torchtitan.train`` (its words after ``-m torchtitan.train``)."""
    words = shlex.split(script.split("-m torchtitan.train", 1)[1])
    assert words[-1] == "$@"  # the user's own overrides follow
    return words[:-1]


def load(tmp_path, monkeypatch, files: dict[str, str]):
    """Write the export and load it as ``torchtitan.train`` would: ConfigManager.parse_args on the
    launch script's arguments, the export folder on the path (the script puts it on PYTHONPATH)."""
    from torchtitan.config import ConfigManager

    folder = tmp_path / "export"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "torchtitan_config", raising=False)  # this test's file, not an earlier one
    return ConfigManager().parse_args(_launch_args(files["launch_torchtitan.sh"]))


def degrees(config, gpus: int) -> dict:
    """The degrees torchtitan's own ParallelDims takes from the config, which checks that they
    multiply to the world size (dp_replicate * dp_shard * cp * tp * pp = WORLD_SIZE)."""
    from torchtitan.distributed import ParallelDims

    dims = ParallelDims.from_config(config.parallelism, gpus)
    return {"replicate": dims.dp_replicate, "shard": dims.dp_shard, "cp": dims.cp, "tp": dims.tp, "pp": dims.pp}


@TITAN
def test_dense_fsdp_and_tp_load_with_the_plans_degrees_and_batches(tmp_path, monkeypatch):
    # llama3-70b on 64 GPUs: tp 8 x dp 8, ZeRO-3 (FSDP over the 8 replicas), 64 sequences of 1 per
    # micro-batch: each rank accumulates 64 / (1 * 8) = 8 micro-batches
    plan = _plan("llama3-70b", 64, tp=8, dp=8, zero=3, global_batch=64, sequence_parallel=True, recompute="full",
                 tp_comm_overlap=True)  # fmt: skip
    out = export(plan, "torchtitan")
    assert set(out.files) == set(EXPORT_FILES["torchtitan"]) and out.warnings == []
    c = load(tmp_path, monkeypatch, out.files)
    assert degrees(c, 64) == {"replicate": 1, "shard": 8, "cp": 1, "tp": 8, "pp": 1}
    assert 1 * 8 * 1 * 8 * 1 == plan.cluster.num_gpus
    assert (c.model_spec.name, c.model_spec.flavor, len(c.model_spec.model.layers)) == ("llama3", "70B", 80)
    assert (c.training.local_batch_size, c.training.global_batch_size, c.training.seq_len) == (1, 64, 4096)
    assert c.parallelism.fsdp_reshard_after_forward == "always"
    assert c.parallelism.enable_sequence_parallel is True and c.parallelism.expert_parallel_degree == 1
    assert type(c.activation_checkpoint).__qualname__ == "FullAC.Config"
    assert c.compile.enable and c.compile.enable_async_tensor_parallel is True
    assert (c.training.mixed_precision_param, c.training.mixed_precision_reduce) == ("bfloat16", "float32")


@TITAN
def test_zero0_replicates_and_keeps_no_recompute(tmp_path, monkeypatch):
    plan = _plan("llama3-8b", 16, tp=2, dp=8, zero=0, micro_batch=2, global_batch=32)
    c = load(tmp_path, monkeypatch, export(plan, "torchtitan").files)
    assert degrees(c, 16) == {"replicate": 8, "shard": 1, "cp": 1, "tp": 2, "pp": 1}
    assert (c.training.local_batch_size, c.training.global_batch_size) == (2, 32)
    assert c.activation_checkpoint is None and c.compile.enable_async_tensor_parallel is False


@TITAN
@pytest.mark.parametrize(
    ("pp", "vpp", "split", "schedule", "parts"),
    [
        # 32 layers in 4 stages of 7/9/9/7, each stage's layers in 2 chunks: (4, 5, 5, 4, 3, 4, 4, 3)
        (4, 2, (7, 9, 9, 7), "Interleaved1F1B", [4, 5, 5, 4, 3, 4, 4, 3]),
        (2, 1, None, "1F1B", [16, 16]),
    ],
)
def test_pipeline_parts_are_the_plans_chunks_in_model_order(tmp_path, monkeypatch, pp, vpp, split, schedule, parts):
    # dp 4: 64 sequences per step are 16 per pipeline, all in one schedule of 16 micro-batches of 1
    plan = _plan("llama3-8b", 4 * pp * 4, tp=4, pp=pp, dp=4, vpp=vpp, zero=1, global_batch=64, pp_layers=split)
    c = load(tmp_path, monkeypatch, export(plan, "torchtitan").files)
    assert degrees(c, 16 * pp) == {"replicate": 1, "shard": 4, "cp": 1, "tp": 4, "pp": pp}
    assert c.parallelism.pipeline_parallel_schedule == schedule
    fqns = c.parallelism.module_fqns_per_model_part
    assert [sum(f.startswith("layers.") for f in part) for part in fqns] == parts
    assert fqns[0][:2] == ["tok_embeddings", "layers.0"] and fqns[-1][-3:] == ["layers.31", "norm", "lm_head"]
    flat = [f for part in fqns for f in part if f.startswith("layers.")]
    assert flat == [f"layers.{i}" for i in range(32)]
    assert (c.training.local_batch_size, c.parallelism.pipeline_parallel_microbatch_size) == (16, 1)
    assert c.training.global_batch_size == 64 and c.training.disable_cuda_graphs is True


@TITAN
def test_pipeline_parts_name_modules_of_torchtitans_model(tmp_path, monkeypatch):
    # torchtitan's llama3 8B, built on the meta device: every module a part names exists, and
    # the parts hold each of its top-level modules and layers exactly once
    import torch

    plan = _plan("llama3-8b", 32, tp=4, pp=4, dp=2, vpp=2, global_batch=32)
    c = load(tmp_path, monkeypatch, export(plan, "torchtitan").files)
    with torch.device("meta"):
        model = c.model_spec.model.build()
    named = [f for part in c.parallelism.module_fqns_per_model_part for f in part]
    children = [n for n, _ in model.named_children() if n != "layers"]
    assert sorted(named) == sorted(children + [f"layers.{n}" for n, _ in model.layers.named_children()])


@TITAN
def test_context_parallel(tmp_path, monkeypatch):
    plan = _plan("llama3-8b", 16, training=TrainingSpec(seq_len=16384, global_batch=8), tp=2, cp=4, dp=2, zero=3,
                 global_batch=8)  # fmt: skip
    c = load(tmp_path, monkeypatch, export(plan, "torchtitan").files)
    assert degrees(c, 16) == {"replicate": 1, "shard": 2, "cp": 4, "tp": 2, "pp": 1}
    assert (c.training.seq_len, c.training.local_batch_size, c.training.global_batch_size) == (16384, 1, 8)


@TITAN
def test_fp8_converts_the_linear_layers_but_the_lm_head(tmp_path, monkeypatch):
    # torchtitan refuses float8 without an SM89 GPU when it builds the converter; this machine has
    # none, so its capability check is answered as an H100's
    import torchtitan.components.quantization.float8 as float8

    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: (9, 0) >= (major, minor))
    plan = _plan("llama3-8b", 16, training=TrainingSpec(seq_len=4096, global_batch=16, dtype="fp8"), tp=2, dp=8,
                 zero=3, global_batch=16)  # fmt: skip
    out = export(plan, "torchtitan")
    c = load(tmp_path, monkeypatch, out.files)
    converted = [fqn for fqn, *_ in c.model_spec.model.traverse(float8.Float8Linear.Config)]
    assert len(converted) == 32 * 5  # per layer: the fused wqkv, wo and the MLP's w1, w2, w3
    assert not any("lm_head" in fqn for fqn in converted)
    assert degrees(c, 16) == {"replicate": 1, "shard": 8, "cp": 1, "tp": 2, "pp": 1}
    assert "recipe_name='rowwise'" in out.files["torchtitan_config.py"]
    assert any("row-wise only" in w and "delayed per-tensor" in w for w in out.warnings)
    assert any("reduces gradients in float32 only" in w for w in out.warnings)  # fp8 plans reduce in 16 bits


@TITAN
@pytest.mark.parametrize(
    ("dtype", "module", "layer"), [("mxfp8", "mx", "MXFP8Linear"), ("nvfp4", "nvfp4", "NVFP4Linear")]
)
def test_blackwell_formats_convert_the_layers_but_the_lm_head(tmp_path, monkeypatch, dtype, module, layer):
    import importlib

    quant = importlib.import_module(f"torchtitan.components.quantization.{module}")
    monkeypatch.setattr(quant, "has_cuda_capability", lambda major, minor: (10, 0) >= (major, minor))  # a B200's
    lay = ParallelLayout(tp=2, dp=4, zero=3, global_batch=8)
    t = TrainingSpec(seq_len=4096, global_batch=8, dtype=dtype)
    plan = plan_from_layout(MODELS["llama3-8b"], t, Cluster(spec=CLUSTERS["dgx-b200"], num_gpus=8), lay)
    c = load(tmp_path, monkeypatch, export(plan, "torchtitan").files)
    converted = [fqn for fqn, *_ in c.model_spec.model.traverse(getattr(quant, layer).Config)]
    assert len(converted) == 32 * 5 and not any("lm_head" in fqn for fqn in converted)


@TITAN
def test_moe_expert_parallel_borrows_the_tp_ranks(tmp_path, monkeypatch):
    # qwen3-30b-a3b on 32 GPUs: tp 2 x dp 16, experts folded over ep 8 (etp 1): torchtitan's expert
    # FSDP degree is dp_shard(16) * cp(1) * tp(2) / ep(8) = 4
    plan = _plan("qwen3-30b-a3b", 32, tp=2, dp=16, ep=8, etp=1, zero=3, global_batch=32)
    c = load(tmp_path, monkeypatch, export(plan, "torchtitan").files)
    assert degrees(c, 32) == {"replicate": 1, "shard": 16, "cp": 1, "tp": 2, "pp": 1}
    p = c.parallelism
    assert p.expert_parallel_degree == 8
    assert p.data_parallel_shard_degree * p.context_parallel_degree * p.tensor_parallel_degree // 8 == 4
    assert (c.model_spec.name, c.model_spec.flavor, len(c.model_spec.model.layers)) == ("qwen3", "30B-A3B", 48)


@TITAN
def test_frozen_deepseek_v3_plan_loads(tmp_path, monkeypatch):
    from ntp_planner.plan import Plan

    plan = Plan.load(FROZEN / "moe_folded.json")  # tp2 pp8 dp16 vpp2 ep16 etp1 on 256 GPUs
    out = export(plan, "torchtitan")
    c = load(tmp_path, monkeypatch, out.files)
    assert degrees(c, 256) == {"replicate": 1, "shard": 16, "cp": 1, "tp": 2, "pp": 8}
    assert c.parallelism.expert_parallel_degree == 16 and len(c.parallelism.module_fqns_per_model_part) == 16
    assert (c.training.local_batch_size, c.training.global_batch_size) == (256 // 16, 256)
    assert any("multi-token prediction" in w for w in out.warnings)


@TITAN
@pytest.mark.parametrize("name", list(TITAN_MODELS))
def test_the_model_table_matches_torchtitans_models(name):
    import importlib

    titan = TITAN_MODELS[name]
    spec = importlib.import_module(f"torchtitan.models.{titan.module}").model_registry(titan.flavor)
    assert (spec.name, spec.flavor) == (titan.module, titan.flavor)
    m = spec.model
    assert (len(m.layers), m.dim, m.vocab_size >= MODELS[name].vocab_size) == (
        MODELS[name].num_layers,
        MODELS[name].hidden_size,
        True,
    )
    recipe = importlib.import_module(f"torchtitan.models.{titan.module}.config_registry")
    assert callable(getattr(recipe, titan.recipe))


@pytest.mark.parametrize(
    ("plan_kw", "message"),
    [
        (dict(model="mixtral-8x7b", gpus=16, tp=2, dp=8, ep=8, global_batch=16),
         "torchtitan 0.3.0 has no model for 'mixtral-8x7b'; it has llama3-8b, llama3-70b, llama3.1-405b, deepseek-v3"),
        (dict(gpus=16, training=TrainingSpec(seq_len=4096, global_batch=16, dtype="fp16"), tp=2, dp=8,
              global_batch=16), "trains in bfloat16 or float32 .*, not fp16; re-plan with --dtype bf16"),
        (dict(model="qwen3-30b-a3b", gpus=32, tp=2, dp=16, ep=8, global_batch=32),
         r"runs experts unsplit \(expert TP 1\) when ep\(8\) > 1, .* but the plan has etp\(2\); re-plan with etp 1"),
        (dict(model="qwen3-30b-a3b", gpus=32, tp=2, dp=16, etp=1, global_batch=32),
         r"splits experts over the TP ranks when ep is 1, so etp\(1\) must equal tp\(2\)"),
        (dict(model="qwen3-30b-a3b", gpus=32, tp=2, dp=16, ep=8, etp=1, zero=0, global_batch=32),
         r"carves EP out of dp_shard\(1\) \* cp\(1\) \* tp\(2\) = 2 ranks, which ep\(8\) does not divide"),
    ],
)  # fmt: skip
def test_what_torchtitan_cannot_run_is_refused_in_one_sentence(plan_kw, message):
    with pytest.raises(InputError, match=message):
        export(_plan(**plan_kw), "torchtitan")


@TITAN
def test_per_layer_tp_exports_its_one_degree_projection_with_a_warning(tmp_path, monkeypatch):
    # layers at TP 4 inside stages of 8: torchtitan, like Megatron, runs one degree for all layers
    plan = _plan("llama3-8b", 16, tp=8, dp=2, global_batch=16, layer_tp=(8,) + (4,) * 32 + (8,))
    out = export(plan, "torchtitan")
    assert out.warnings[0].startswith("torchtitan runs one TP degree for every dense layer; the per-layer plan")
    c = load(tmp_path, monkeypatch, out.files)
    assert degrees(c, 16) == {"replicate": 2, "shard": 1, "cp": 1, "tp": 8, "pp": 1}  # ZeRO-0: replicated


def test_zero0_with_context_parallel_warns_that_torchtitan_shards_over_cp():
    plan = _plan("llama3-8b", 16, training=TrainingSpec(seq_len=8192, global_batch=4), tp=2, cp=4, dp=2, zero=0,
                 global_batch=4)  # fmt: skip
    assert export(plan, "torchtitan").warnings == [
        "torchtitan shards the weights over the cp(4) ranks even without ZeRO (its FSDP mesh includes cp): expect "
        "weight all-gathers the ZeRO-0 plan does not count"
    ]


@TITAN
@pytest.mark.parametrize(("pp", "disabled", "warned"), [(1, False, False), (2, True, True)])
def test_cuda_graphs_follow_the_plan_where_torchtitan_captures_them(tmp_path, monkeypatch, pp, disabled, warned):
    t = TrainingSpec(seq_len=4096, global_batch=16, cuda_graphs=True)
    plan = _plan("llama3-8b", 8 * pp, training=t, tp=4, pp=pp, dp=2, global_batch=16)
    out = export(plan, "torchtitan")
    assert any("captures no CUDA graphs" in w for w in out.warnings) is warned
    assert load(tmp_path, monkeypatch, out.files).training.disable_cuda_graphs is disabled


def test_a_model_of_another_shape_under_a_catalogue_name_is_refused():
    m = MODELS["llama3-8b"]
    deeper = type(m).model_validate({**m.model_dump(), "num_layers": 40})
    with pytest.raises(InputError, match="llama3-8b has 40 layers but torchtitan's llama3 8B has 32"):
        export(_plan(deeper, 16, tp=2, dp=8, global_batch=16), "torchtitan")


@TITAN
@pytest.mark.parametrize(("zero", "warned"), [(1, True), (2, True), (3, False)])
def test_zero1_and_zero2_export_as_fsdp_that_keeps_the_weights_with_a_warning(tmp_path, monkeypatch, zero, warned):
    plan = _plan("llama3-8b", 16, tp=2, dp=8, zero=zero, global_batch=16)
    out = export(plan, "torchtitan")
    assert any(f"torchtitan has no ZeRO-{zero}" in w for w in out.warnings) is warned
    c = load(tmp_path, monkeypatch, out.files)
    assert c.parallelism.data_parallel_shard_degree == 8
    assert c.parallelism.fsdp_reshard_after_forward == ("never" if warned else "always")


HOSTILE = ["/data/c4 copy", 'it\'s "quoted"\\', "line\nbreak'''", "$(touch PWNED)"]


@TITAN
@pytest.mark.parametrize("value", HOSTILE)
def test_data_path_and_save_dir_reach_the_config_unchanged(tmp_path, monkeypatch, value):
    plan = _plan("llama3-8b", 16, tp=2, dp=8, global_batch=16)
    c = load(tmp_path, monkeypatch, export(plan, "torchtitan", data_path=value, save_dir=value).files)
    assert c.dataloader.dataset_path == value
    assert c.checkpoint.folder == value and c.checkpoint.enable is True
    assert not (tmp_path / "PWNED").exists()


@TITAN
def test_cli_writes_both_files_and_the_written_config_loads(tmp_path, monkeypatch):
    plan = _plan("llama3-8b", 64, tp=4, pp=4, dp=4, vpp=2, zero=1, global_batch=64, recompute="selective")
    path, folder = tmp_path / "plan.json", tmp_path / "out"
    plan.save(path)
    result = CliRunner().invoke(app, ["export", str(path), "--format", "torchtitan", "-o", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["files"] == [str(folder / "torchtitan_config.py"), str(folder / "launch_torchtitan.sh")]
    assert shown["warnings"] == export(plan, "torchtitan").warnings and len(shown["warnings"]) == 2
    assert result.stderr.count("warning: ") == 2
    script = folder / "launch_torchtitan.sh"
    assert script.stat().st_mode & 0o111 and "--nproc_per_node 8 " in script.read_text()
    assert "NNODES=${NNODES:-8}" in script.read_text()  # 64 GPUs on hosts of 8
    files = {p.name: p.read_text() for p in folder.iterdir()}
    c = load(tmp_path, monkeypatch, files)
    assert degrees(c, 64) == {"replicate": 1, "shard": 4, "cp": 1, "tp": 4, "pp": 4}
    assert (c.training.local_batch_size, c.training.global_batch_size) == (16, 64)


def test_cli_refuses_a_replan_in_one_sentence(tmp_path):
    from ntp_planner.failures.replan import Replanner

    plan = _plan("llama3-8b", 64, tp=8, pp=2, dp=4, global_batch=32, sequence_parallel=True, zero=1)
    plan_path, replan_path = tmp_path / "plan.json", tmp_path / "r.json"
    plan.save(plan_path)
    replan_path.write_text(Replanner(plan).replan(frozenset({3, 12}), "ntp").model_dump_json())
    argv = ["export", str(plan_path), "--format", "torchtitan", "--replan", str(replan_path), "-o", str(tmp_path / "o")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --replan: torchtitan cannot express a re-planned state")
    assert not (tmp_path / "o").exists()


def test_export_imports_neither_torch_nor_torchtitan(tmp_path):
    plan_path = tmp_path / "plan.json"
    _plan("llama3-8b", 16, tp=2, dp=8, global_batch=16).save(plan_path)
    argv = ["export", str(plan_path), "--format", "torchtitan", "-o", str(tmp_path / "o")]
    code = (
        f"import sys\nfrom ntp_planner.cli import app\ntry:\n    app({argv!r})\n"
        "except SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchtitan')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]" and (tmp_path / "o" / "torchtitan_config.py").exists()


def test_a_plan_costed_for_another_runtime_warns_and_the_runtime_survives_a_save(tmp_path):
    lay = ParallelLayout(tp=8, dp=8, zero=3, global_batch=64, sequence_parallel=True)
    megatron = plan_from_layout(
        MODELS["llama3-8b"],
        TrainingSpec(seq_len=4096, global_batch=64),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64),
        lay,
    )
    assert megatron.runtime == "megatron" and "runtime" not in megatron.model_dump(mode="json")  # old plans unchanged
    last = export(megatron, "torchtitan").warnings[-1]
    assert last.startswith("the plan's step time and memory were costed for the megatron runtime, not torchtitan's")
    titan = _plan("llama3-8b", 64, tp=8, dp=8, zero=3, global_batch=64, sequence_parallel=True)
    titan.save(tmp_path / "plan.json")
    from ntp_planner.plan import Plan

    again = Plan.load(tmp_path / "plan.json")
    assert again.runtime == "torchtitan" and not any("costed for" in w for w in export(again, "torchtitan").warnings)


def _extra_in_torchtitan(m) -> int:
    """Parameters torchtitan's model has that ntp's count leaves out: the routers' biases of GPT-OSS
    (one per expert a layer). Qwen3's per-head query/key RMSNorms are counted (ModelSpec.qk_norm)."""
    return m.num_layers * m.num_experts if m.is_moe and m.bias else 0


@TITAN
@pytest.mark.parametrize("name", list(TITAN_MODELS))
def test_torchtitan_builds_the_model_ntp_counts(tmp_path, monkeypatch, name):
    """The model torchtitan builds from the loaded export (its model config's build(), on the meta
    device) has ntp's parameter count, GPT-OSS's router biases and Qwen3's per-head query/key
    norms included; DeepSeek-V3's MTP module is not built (torchtitan 0.3 has none: the export
    says so)."""
    import torch
    import torchtitan.components.quantization.float8 as float8

    # GPU detection only: the llama3_405b recipe the export starts from builds a float8 converter,
    # which asks for an SM89 GPU (the export then replaces the model spec with a bf16 one)
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    m = MODELS[name]
    layout = dict(tp=2, dp=4, global_batch=8) | (dict(ep=2, etp=1) if m.is_moe else {})
    c = load(tmp_path, monkeypatch, export(_plan(name, 8, **layout), "torchtitan").files)
    with torch.device("meta"):
        model = c.model_spec.model.build()
    built = sum(p.numel() for p in model.parameters())
    assert built == m.params_total
    assert {"qwen3-30b-a3b": 30_532_122_624}.get(name, built) == built  # Qwen3-30B-A3B in transformers, q/k norms in
    assert {"llama3-8b": 8_030_261_248, "deepseek-v3": 671_026_404_352}.get(name, built) == built
