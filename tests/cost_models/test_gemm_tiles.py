"""Round 4's GPU terms as CostEnv.op_time composes them (tile quantisation, expert waves, Blackwell
Ultra's power headroom): each op's time over the same op with the term switched off, against
hand-derived tile and wave counts. tests/cost_models/test_efficiency.py and test_moe.py pin the
functions themselves."""

from __future__ import annotations

import pytest

from cost_models.blocks import CostEnv
from cost_models.catalogue import MODELS
from cost_models.efficiency import DEFAULT_EFFICIENCY as EFF
from cost_models.flops import gemm
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS

UNTILED = EFF.model_copy(update={"gemm_tile": {}})
FLAT_POWER = EFF.model_copy(update={"power_rate_exponent": 0.0})


def _ratio(op, cluster="dgx-b200", off=UNTILED, eff=EFF, model="qwen3-30b-a3b", **training) -> float:
    """op_time of ``op`` with ``eff`` over its time with ``off`` (the same settings otherwise)."""
    train = TrainingSpec(seq_len=4096, global_batch=256, **training)
    lay = ParallelLayout(dp=64, ep=8, global_batch=256)
    env = CostEnv(MODELS[model], train, lay, Cluster(spec=CLUSTERS[cluster], num_gpus=64), eff)
    other = CostEnv(MODELS[model], train, lay, Cluster(spec=CLUSTERS[cluster], num_gpus=64), off)
    return env.op_time(op) / other.op_time(op)


def test_an_expert_gemm_costs_its_whole_waves_of_tiles_four_experts_at_a_time():
    # Qwen3-30B-A3B on a B200: 16 local experts of 8,192 rows, up-projection 1,536 x 2,048 (whole tiles).
    # Transformer Engine's 4 streams on 74 SM pairs: forward 6 x 32 x 4 = 768 tiles, 10.4 waves -> 11;
    # data gradient 8 x 32 x 4 = 1,024, 13.8 -> 14; weight gradient 6 x 8 x 4 = 192, 2.6 -> 3
    up = gemm("experts-up", 8192, 1536, 2048, batch=16)
    eager = (11 / (768 / 74) + 14 / (1024 / 74) + 3 / (192 / 74)) / 3
    assert _ratio(up) == pytest.approx(eager, rel=1e-9)
    # every local expert at once (a CUDA graph's grouped GEMM, torchtitan's torch._grouped_mm): 16 x the
    # tiles, 41.5 -> 42, 55.4 -> 56, 10.4 -> 11 waves
    one_kernel = (42 / (3072 / 74) + 56 / (4096 / 74) + 11 / (768 / 74)) / 3
    assert _ratio(up, cuda_graphs=True) == pytest.approx(one_kernel, rel=1e-9)
    titan = EFF.model_copy(update={"runtime": "torchtitan"})
    assert _ratio(up, eff=titan, off=titan.model_copy(update={"gemm_tile": {}})) == pytest.approx(one_kernel, rel=1e-9)


def test_a_partial_tile_and_its_waves_multiply():
    # GPT-OSS on GB200 (148 SMs, as B200): 2 local experts of 32,768 rows, up-projection 5,760 x 2,880.
    # Tiles: 5,760 -> 23 x 256 = 5,888, 2,880 -> 12 x 256 = 3,072; forward, data and weight gradients
    # average the padding; waves: 5,888 tiles / 74 = 79.6 -> 80, 3,072 / 74 = 41.5 -> 42, 552 / 74 = 7.5 -> 8
    up = gemm("experts-up", 32768, 5760, 2880, batch=2)
    pad_n, pad_k = 5888 / 5760, 3072 / 2880
    tiles = (pad_n + pad_k + pad_n * pad_k) / 3
    waves = (80 / (5888 / 74) + 42 / (3072 / 74) + 8 / (552 / 74)) / 3
    assert _ratio(up, "gb200-nvl72", model="gpt-oss-120b") == pytest.approx(tiles * waves, rel=1e-9)


def test_only_weight_gemms_wider_than_a_tile_are_padded():
    # Nemotron-340B's QKV shard at TP 8 on Hopper: 12 query heads and 2 KV heads of 192, 2,688 wide:
    # 21 tiles of 128 (whole); on Blackwell 10.5 tiles of 256 -> 11 (2,816), the 18,432 input whole
    qkv = gemm("qkv", 4096, 2688, 18432)
    assert _ratio(qkv, "dgx-h100") == pytest.approx(1.0)
    assert _ratio(qkv) == pytest.approx((2816 / 2688 * 2 + 1) / 3, rel=1e-9)
    # unfused attention: a 192-wide head is a head dimension, not a weight's (no 256 / 192 padding)
    scores = gemm("attention-scores", 4096, 4096, 192, batch=8)
    values = gemm("attention-values", 4096, 192, 4096, batch=8)
    assert _ratio(scores, "dgx-h100") == _ratio(values, "dgx-h100") == pytest.approx(1.0)
    # a router narrower than one tile (Mixtral's 8 experts; 128 here on Blackwell) is not padded to it
    assert _ratio(gemm("router", 8192, 8, 4096)) == _ratio(gemm("router", 8192, 128, 2048)) == pytest.approx(1.0)


def test_blackwell_ultras_gemms_run_faster_by_its_extra_power():
    fc = gemm("fc1", 8192, 8192, 8192)  # whole tiles
    logits = gemm("logits", 8192, 8192, 8192, low_precision=False)  # 16-bit whatever the format
    # GB300 draws 1,400 W on GB200's 1,200 W peaks, B300 1,100 W on B200's 1,000 W: time x (basis / tdp) ** 0.578
    assert _ratio(fc, "gb300-nvl72", FLAT_POWER) == pytest.approx((1200 / 1400) ** 0.578, rel=1e-9)
    assert _ratio(fc, "dgx-b300", FLAT_POWER) == pytest.approx((1000 / 1100) ** 0.578, rel=1e-9)
    assert _ratio(fc, "gb200-nvl72", FLAT_POWER) == _ratio(fc, "dgx-h100", FLAT_POWER) == 1.0
    # NVFP4's Blackwell Ultra peak is its own: no headroom on the fp4 GEMMs, the 16-bit logits keep theirs
    assert _ratio(fc, "gb300-nvl72", FLAT_POWER, dtype="nvfp4") == 1.0
    assert _ratio(logits, "gb300-nvl72", FLAT_POWER, dtype="nvfp4") == pytest.approx((1200 / 1400) ** 0.578)
