"""Head-aligned uneven TP shards reproduce the single-process model exactly (one process)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.model.reference import Reference, TinyConfig, zero_gradient_params  # noqa: E402
from ntp_planner.executor.parallel.ownership import layer_shards  # noqa: E402
from tests.support.simulated_tp import gathered_grads, shard_model, simulated_tp_loss  # noqa: E402

CFG = TinyConfig(vocab=64, hidden=32, layers=2, heads=8, kv_heads=2, ffn=48)


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, CFG.vocab, (3, 10), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def assert_sharded_equals_reference(cfg: TinyConfig, degrees: list[int]) -> None:
    """Every rank's partials summed in one process give the reference's loss and, placed back,
    its gradients (float64); every parameter learns but the key bias without rotary positions
    (a shift the softmax ignores)."""
    torch.set_default_dtype(torch.float64)
    try:
        ref = Reference(cfg, seed=0)
        tokens, targets = batch()
        sharded = shard_model(ref, degrees)
        loss = simulated_tp_loss(sharded, tokens, targets)
        expected = ref.loss(tokens, targets)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
        loss.backward()
        expected.backward()
        grads = gathered_grads(sharded)
        assert set(grads) == {name for name, _ in ref.named_parameters()}
        for name, param in ref.named_parameters():
            dead = name.rsplit(".", 1)[-1] in zero_gradient_params(cfg)
            assert (param.grad.abs().max() < 1e-12) == dead, name
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-10, atol=1e-12, msg=name)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("degrees", [[1, 1], [2, 2], [4, 4], [8, 8], [3, 3], [5, 7], [4, 3], [2, 8]])
def test_sharded_loss_and_gradients_equal_the_reference(degrees):
    assert_sharded_equals_reference(CFG, degrees)


def test_uneven_gqa_replicates_cut_kv_heads():
    s = layer_shards(heads=8, kv_heads=2, ffn=48, degree=3)
    assert s.heads == ((0, 1, 2), (3, 4, 5), (6, 7))
    assert s.kv_owners(0) == (0, 1) and s.kv_owners(1) == (1, 2)
    thirty = layer_shards(heads=32, kv_heads=32, ffn=30 * 4, degree=30)
    assert [len(h) for h in thirty.heads].count(2) == 2  # the NTP paper's TP30 over 32 heads
    with pytest.raises(ValueError, match="degree 9"):
        layer_shards(heads=8, kv_heads=2, ffn=48, degree=9)


GPT = TinyConfig(vocab=64, hidden=32, layers=2, heads=8, kv_heads=2, ffn=48, norm="layer", mlp="gelu", bias=True,
                 positions="learned", max_positions=16)  # fmt: skip
GPT_ROTARY = TinyConfig(vocab=64, hidden=32, layers=2, heads=8, kv_heads=2, ffn=48, norm="layer", mlp="gelu", bias=True)
NEMOTRON = TinyConfig(vocab=64, hidden=32, layers=2, heads=8, kv_heads=2, ffn=48, norm="layer", mlp="relu2")


@pytest.mark.parametrize("cfg", [GPT, GPT_ROTARY, NEMOTRON], ids=["gpt", "gpt-rotary", "nemotron"])
@pytest.mark.parametrize("degrees", [[2, 2], [3, 3], [4, 3]])
def test_gpt_and_nemotron_blocks_sharded_equal_the_reference(cfg, degrees):
    # TP3 cuts both KV groups: the cut K/V biases are replicated on their owners and summed
    assert_sharded_equals_reference(cfg, degrees)
