"""Layout rules: each violation names the rule and shows the arithmetic."""

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec, check_layout

LLAMA70 = MODELS["llama3-70b"]
TRAIN = TrainingSpec(seq_len=8192, global_batch=64)


def check(domain=8, gpus=64, **kw):
    check_layout(ParallelLayout(global_batch=64, **kw), LLAMA70, TRAIN, gpus, domain)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(tp=8, pp=2, dp=2), r"tp\(8\) \* cp\(1\) \* dp\(2\) \* pp\(2\) = 32 != GPUs\(64\)"),
        (dict(tp=16, dp=4), r"tp\(16\) must divide the NVLink domain size \(8\)"),
        (dict(tp=3, dp=1, gpus=3, domain=3), r"heads\(64\) % tp\(3\) = 1"),
        (dict(tp=32, dp=2, domain=32), None),  # 64 heads, 8 KV heads: tp 32 replicates KV heads - valid
        (dict(tp=8, pp=128, gpus=1024, dp=1), r"pp\(128\) > layers\(80\)"),
        (dict(tp=8, pp=8, vpp=11, dp=1), r"pp\(8\) \* vpp\(11\) = 88 chunks for 80 layers leave chunk\(s\) \[80, 81"),
        (dict(tp=8, pp=2, dp=4, pp_layers=(40, 41)), r"the pipeline chunks hold 81 layers but the model has 80"),
        (dict(tp=4, pp=4, dp=4, vpp=2, micro_batch=8), r"micro-batches per step \(2\) to be a multiple of pp\(4\)"),
        (dict(tp=8, ep=2, dp=8), r"ep\(2\) > 1 needs an MoE model"),
    ],
)
def test_layout_rules(kw, message):
    if message is None:
        check(**kw)
    else:
        with pytest.raises(ValueError, match=message):
            check(**kw)


def test_kv_groups_rule():
    model = MODELS["llama3-70b"].model_copy(update={"num_kv_heads": 8, "num_heads": 48})
    with pytest.raises(ValueError, match=r"kv_heads\(8\) and tp\(6\) must divide one another"):
        check_layout(ParallelLayout(tp=6, dp=1, global_batch=64), model, TRAIN, 6, 6)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(dp=3, micro_batch=2), r"global_batch\(64\) is not divisible by micro_batch\(2\) \* dp\(3\) = 6"),
        (dict(vpp=2), r"interleaving \(vpp=2\) needs pp > 1"),
        (dict(sequence_parallel=True), r"sequence parallelism needs tp > 1"),
        (dict(pp=2, pp_layers=(80,)), r"pp_layers has 1 entries but pp = 2"),
    ],
)
def test_self_consistency_rules(kw, message):
    with pytest.raises(ValueError, match=message):
        ParallelLayout(global_batch=64, **kw)


def test_uneven_split_gives_leading_stages_one_more():
    assert ParallelLayout(pp=16, global_batch=16).stage_layers(126) == (8,) * 14 + (7,) * 2
    assert ParallelLayout(pp=3, global_batch=3, pp_layers=(10, 30, 40)).stage_layers(80) == (10, 30, 40)


MIXTRAL = MODELS["mixtral-8x7b"]  # 8 experts of width 14,336, 32 heads, 8 KV heads


def check_moe(gpus=8, domain=8, **kw):
    check_layout(ParallelLayout(global_batch=64, **kw), MIXTRAL, TRAIN, gpus, domain)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        # ep 8 cannot split dp 1 but folds over the eight TP ranks (Megatron's parallel folding)
        (dict(tp=8, ep=8), r"etp\(8\) \* ep\(8\) = 64 does not divide the tp\(8\) \* cp\(1\) \* dp\(1\) = 8 GPUs"),
        (dict(tp=8, ep=8, etp=1), None),
        (dict(tp=4, dp=2, ep=4, etp=2), None),
        (dict(tp=4, dp=2, ep=8, etp=2), r"etp\(2\) \* ep\(8\) = 16 does not divide"),
        (dict(tp=2, dp=4, etp=16, gpus=8), r"etp\(16\) must divide the NVLink domain size \(8\)"),
        (dict(tp=8, etp=1, ep=1), None),
    ],
)
def test_parallel_folding_rules(kw, message):
    if message is None:
        check_moe(**kw)
    else:
        with pytest.raises(ValueError, match=message):
            check_moe(**kw)


def test_folding_fields_need_an_moe_model():
    with pytest.raises(ValueError, match=r"etp\(1\) needs an MoE model; llama3-70b is dense"):
        check(tp=8, dp=8, etp=1)
    with pytest.raises(ValueError, match=r"moe_dispatcher and moe_overlap apply to MoE models"):
        check(tp=8, dp=8, moe_dispatcher="flex")


def test_folded_layout_degrees_and_description():
    lay = ParallelLayout(tp=4, dp=2, ep=8, etp=1, moe_dispatcher="flex", moe_overlap="1f1b", global_batch=64)
    assert (lay.expert_tp, lay.expert_dp, lay.folded) == (1, 1, True)
    assert lay.describe() == "tp4 pp1 dp2 ep8 etp1 moe-flex a2a-1f1b mb1"
    assert ParallelLayout(tp=4, dp=2, ep=2, global_batch=64).expert_dp == 1
    assert ParallelLayout(tp=4, dp=4, ep=2, global_batch=64).expert_dp == 2
