"""`ntp validate --full-size`: a one-GPU plan run at its real size (no torch needed here; the CLI
refusals go through CliRunner and stop before any process starts)."""

import pytest
from typer.testing import CliRunner

from cost_models.catalogue import MODELS
from cost_models.hf_config import load_model_file
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.cli import app
from ntp_planner.executor.shrink.full import full_size, memory_check
from ntp_planner.solver.planner import plan_from_layout
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS
from topologies.errors import InputError

TINYLLAMA = "benchmarks/gpu_check/tinyllama-1.1b.json"


def one_gpu_plan(model, seq_len=2048, global_batch=4, micro_batch=2, recompute="none"):
    """A one-GPU plan (tp = pp = dp = 1) on a one-GPU host of the H200's cluster file."""
    spec = CLUSTERS["hgx-h200"].model_copy(update={"domain_size": 1, "gpus_per_node": 1})
    lay = ParallelLayout(micro_batch=micro_batch, global_batch=global_batch, recompute=recompute)
    return plan_from_layout(model, TrainingSpec(seq_len=seq_len, global_batch=global_batch), Cluster(spec=spec,
                            num_gpus=1), lay)  # fmt: skip


def test_tinyllama_runs_at_its_own_size_as_planned():
    plan = one_gpu_plan(load_model_file(TINYLLAMA), recompute="selective")
    s = full_size(plan, steps=5, seed=3)
    cfg, spec = s.spec.cfg, s.spec
    # TinyLlama-1.1B's config.json, every width kept: 22 layers of 2048, 32 heads of 64, 4 KV heads
    assert (cfg.vocab, cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn) == (32000, 2048, 22, 32, 4, 5632)
    assert (cfg.head_dim, cfg.mlp, cfg.norm, cfg.positions, cfg.bias) == (64, "swiglu", "rms", "rope", False)
    # the plan's batch: 4 sequences of 2048 tokens in 2 micro-batches of 2, on one process
    assert (spec.seq_len, spec.micro_batch, spec.world_size, spec.total_sequences) == (2048, 2, 1, 4)
    assert [r.micro_batches for r in spec.replicas] == [2]
    blocks = spec.replicas[0].stages[0].blocks
    assert len(blocks) == 24 and blocks[0].kind == "embed" and blocks[-1].kind == "head"
    assert {b.degree for b in blocks} == {1} and [b.layer for b in blocks[1:-1]] == list(range(22))
    assert (spec.steps, spec.seed, spec.recompute) == (5, 3, "selective")
    assert s.plan_ranks == ((0, plan.placement[0]),) and s.replicas == (0,) and s.stage_groups == ((0,),)
    assert "1.10B parameters" in spec.notes[0] and "2 micro-batches of 2" in spec.notes[0]


def test_a_plan_of_several_gpus_or_with_experts_is_refused_with_its_arithmetic():
    cluster = Cluster(spec=CLUSTERS["hgx-h200"], num_gpus=8)
    lay = ParallelLayout(tp=2, dp=4, global_batch=8)
    plan = plan_from_layout(MODELS["llama3-8b"], TrainingSpec(seq_len=2048, global_batch=8), cluster, lay)
    with pytest.raises(InputError, match=r"tp\(2\) x pp\(1\) x cp\(1\) x dp\(4\) = 8 GPUs"):
        full_size(plan)
    moe = MODELS["mixtral-8x7b"].model_copy(update={"num_layers": 2})
    with pytest.raises(InputError, match="runs dense models; mixtral-8x7b has 8 experts"):
        full_size(one_gpu_plan(moe))


def test_memory_check_counts_the_state_and_on_cpu_the_reference_beside_it():
    plan = one_gpu_plan(load_model_file(TINYLLAMA))
    # 22 layers x 44,044,288 (q, k, v, o; gate, up, down; two norms) + 2 x 65,536,000 (embedding, head) + 2048
    params = plan.model.num_params
    assert params == 1_100_048_384
    memory_check(plan, "nccl", "float32", 16 * params)  # exactly fits one GPU
    with pytest.raises(InputError, match=r"in float32 needs about 1 x 16 bytes x 1.10B parameters = 16.4 GiB"):
        memory_check(plan, "nccl", "float32", 16 * params - 1)
    # bf16: a bf16 copy (2) beside fp32 masters, gradients and moments (16); on CPU the reference's too
    host = r"in bfloat16 needs about 2 x 18 bytes x 1.10B parameters = 36.9 GiB of training state, more than this host"
    with pytest.raises(InputError, match=host):
        memory_check(plan, "gloo", "bfloat16", 30 * params)
    memory_check(plan, "gloo", "float64", 64 * params)


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("full")
    one = folder / "one.json"
    one.write_text(one_gpu_plan(MODELS["llama2-7b"].model_copy(update={"num_layers": 2})).model_dump_json())
    cluster = Cluster(spec=CLUSTERS["hgx-h200"], num_gpus=8)
    eight = plan_from_layout(MODELS["llama3-8b"], TrainingSpec(seq_len=2048, global_batch=8), cluster,
                             ParallelLayout(tp=8, global_batch=8))  # fmt: skip
    (folder / "eight.json").write_text(eight.model_dump_json())
    return folder


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eight.json", "--full-size"], "layout is tp(8) x pp(1) x cp(1) x dp(1) = 8 GPUs"),
        (["one.json", "--full-size", "--seq-len", "64"], "drop --fail, --repair, --replan and --seq-len"),
        (["one.json", "--full-size", "--fail", "0@1"], "on one process; drop --fail, --repair"),
        (["one.json", "--full-size", "--nproc", "2"], "on one process, not 2; drop --nproc"),
    ],
)
def test_cli_refuses_what_full_size_cannot_run_in_one_sentence(plan_files, args, message, monkeypatch):
    monkeypatch.chdir(plan_files)
    out = CliRunner().invoke(app, ["validate", *args])
    assert out.exit_code == 2, out.output
    assert message in " ".join(out.output.split()) and "Traceback" not in out.output
    assert out.output.strip().count("\n") == 0  # one line: no report, no traceback
