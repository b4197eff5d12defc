"""Interleaved 1F1B (vpp > 1) on gloo against the single-process reference.

PP2 x vpp2 on stages of width 2 (4 processes): chunk 0 = embedding at 2, layers 0 at 2 and 1 at
1 (two copies); chunk 1 (stage 1) = layers 2 at 1 and 3 at 2; chunk 2 (stage 0) = layer 4 at 2;
chunk 3 (stage 1) = layer 5 at 1 and the LM head at 2. Each stage holds two chunks whose degrees
differ, activations wrap from stage 1's chunk 0 to stage 0's chunk 1, and 4 micro-batches run in
Megatron's order (``test_interleave``): warm-up, steady 1F1B, cool-down.
"""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.launch import launch  # noqa: E402
from tests.support.mutations import plant  # noqa: E402

CHUNKS = [[2, 2, 1], [1, 2], [2], [1, 2]]  # degrees per model chunk, chunk c on stage c % 2


def run(dtype: str, worker_init=None):
    spec = make_spec(TinyConfig(layers=6), CHUNKS, [([2, 2], 4)], 2, 8, vpp=2, dtype=dtype, steps=2)
    assert [st.chunk_sizes for st in spec.replicas[0].stages] == [(3, 1), (2, 2)]
    return launch(spec, timeout_s=120, worker_init=worker_init)


def errors(result):
    return max(result.max_rel_error_loss, result.max_rel_error_grads, result.max_rel_error_params)


@pytest.mark.timeout(300)
def test_interleaved_pp2_vpp2_per_layer_degrees_is_exact_in_float64():
    result = run("float64")
    assert errors(result) <= 1e-10
    assert len(result.losses) == 2 and result.losses[1] < result.losses[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_interleaved_pp2_vpp2_per_layer_degrees_in_float32():
    assert errors(run("float32")) <= 1e-5


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(300)
def test_a_chunk_whose_layers_run_in_reverse_is_caught(monkeypatch):
    bug = plant(monkeypatch, "chunk-layers-reversed")  # chunk 0 runs layer 1 before layer 0, ...
    assert errors(run("float64", bug)) > 1e-3
