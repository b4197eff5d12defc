"""measure_blocks runs the executor's own code: the LocalComm forward of a block equals the
single-process reference, and a degree-t shard has the shard's shapes."""

import pytest
import torch

from cost_models.profile import BlockShape
from ntp_planner.executor.model.reference import Reference, rms_norm
from ntp_planner.executor.parallel.tensor import rank_slice
from ntp_planner.profiler.blocks import block_flops, block_stage, measure_blocks, tiny_config
from topologies.errors import InputError

CPU = torch.device("cpu")


def shape(kind="layer", tp=1, seq=8, **kw):
    dims = dict(hidden=32, heads=8, kv_heads=2, head_dim=4, ffn=48, vocab=64) | kw
    return BlockShape(kind=kind, tp=tp, seq_len=seq, **dims)


def _load_reference(model, ref: Reference, tp: int) -> None:
    """Overwrite the stage's random shard with TP rank 0's slice of the reference weights."""
    bs = model.blocks[0]
    for key, t in bs.params.items():
        name = f"layers.0.{key}" if bs.block.kind == "layer" else key
        with torch.no_grad():
            t.copy_(rank_slice(dict(ref.named_parameters())[name], model.cfg, key, tp, 0))


def test_degree_1_layer_equals_the_reference_layer():
    s = shape()
    ref = Reference(tiny_config(s), seed=3)
    model = block_stage(s, 2, CPU, torch.float32, torch.Generator().manual_seed(0))
    _load_reference(model, ref, 1)
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(model.forward(x, None, 1.0), ref.layer_forward(ref.layers[0], x))


def test_degree_1_head_is_the_whole_vocabulary_cross_entropy():
    s = shape("head")
    ref = Reference(tiny_config(s), seed=3)
    model = block_stage(s, 2, CPU, torch.float32, torch.Generator().manual_seed(0))
    _load_reference(model, ref, 1)
    x, targets = torch.randn(2, 8, 32), torch.randint(0, 64, (2, 8))
    logits = rms_norm(x, ref.norm) @ ref.head.T
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1), reduction="sum")
    torch.testing.assert_close(model.forward(x, targets, 1.0), expected)


def test_degree_3_shard_holds_rank_0s_slice_and_its_partial_output():
    """8 heads on 3 ranks: rank 0 holds query heads 0-2 (KV head 0) and FFN columns 0-15; its
    forward adds its partial attention and MLP outputs (the all-reduce is a no-op)."""
    s = shape(tp=3)
    model = block_stage(s, 1, CPU, torch.float32, torch.Generator().manual_seed(0))
    p = model.blocks[0].params
    assert {k: tuple(v.shape) for k, v in p.items()} == {
        "norm1": (32,), "q": (12, 32), "k": (4, 32), "v": (4, 32), "o": (32, 12),
        "norm2": (32,), "gate": (16, 32), "up": (16, 32), "down": (32, 16),
    }  # fmt: skip
    vocab = block_stage(shape("head", tp=3), 1, CPU, torch.float32, torch.Generator().manual_seed(0))
    assert tuple(vocab.blocks[0].params["head"].shape) == (22, 32)  # 64 rows: 22, 21, 21


def test_degree_1_moe_layer_equals_the_reference_layer():
    s = shape("moe_layer", experts=4, top_k=2, ffn=12)
    ref = Reference(tiny_config(s), seed=3)
    model = block_stage(s, 2, CPU, torch.float32, torch.Generator().manual_seed(0))
    _load_reference(model, ref, 1)
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(model.forward(x, None, 1.0), ref.layer_forward(ref.layers[0], x))
    assert tuple(model.blocks[0].params["expert_gate"].shape) == (4, 12, 32)  # every expert, ep 1


def test_measures_every_kind_fast_and_forward_and_backward_positive():
    requests = [(shape(k, tp), b) for k in ("embedding", "layer", "head", "moe_layer") for tp in (1, 2) for b in (1, 4)]
    requests = [
        (s.model_copy(update={"experts": 4, "top_k": 2}) if s.kind == "moe_layer" else s, b) for s, b in requests
    ]
    got = measure_blocks(requests, "cpu", "float32", reps=3, threads_per_rank=1)
    assert [(b.shape.kind, b.shape.tp, b.micro_batch) for b in got] == [(s.kind, s.tp, b) for s, b in requests]
    assert all(b.fwd_s > 0 and b.bwd_s > 0 and b.samples == 3 for b in got)
    assert sum(b.fwd_s + b.bwd_s for b in got) < 1.0  # tiny shapes: ntp validate measures them in-process


def test_a_shape_the_executor_cannot_run_is_refused():
    with pytest.raises(InputError, match=r"hidden = heads \* head_dim, but 8 \* 8 = 64 != 32"):
        tiny_config(shape(head_dim=8))


def test_block_flops_by_hand():
    # layer, 1 sequence of 8 tokens, degree 1: q,o 2*8*32*32 each, k,v 2*8*32*8 each, MLP 3 * 2*8*32*48,
    # attention 4 * 1 * 8 heads * 64 * 4
    assert (
        block_flops(shape(), 1) == 2 * (2 * 8 * 32 * 32) + 2 * (2 * 8 * 32 * 8) + 3 * 2 * 8 * 32 * 48 + 4 * 8 * 64 * 4
    )
    assert block_flops(shape("head", tp=2), 1) == 2 * 8 * 32 * 32 + 5 * 8 * 64
