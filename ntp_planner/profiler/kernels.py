"""Kernels on their own: GEMM throughput over a sweep of shapes, fused attention, and the
memory-bound passes of a training step (the executor's RMSNorm, the SwiGLU activation, an AdamW
step, a plain copy) as bandwidth."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from cost_models.profile import AttentionTime, GemmTime, PassTime
from ntp_planner.executor.model.reference import rms_norm
from ntp_planner.profiler.timing import median_time


def measure_gemms(
    shapes: Iterable[tuple[int, int, int]], device: torch.device, dtype: torch.dtype, reps: int, tick=None
) -> list[GemmTime]:
    """``[m, k] x [k, n]`` products: 2 m n k FLOPs each."""
    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        t = median_time(lambda _: a @ b, device, reps)  # noqa: B023
        out.append(GemmTime(m=m, n=n, k=k, time_s=t, flops_per_s=2.0 * m * n * k / t))
        if tick:
            tick(f"gemm {m}x{n}x{k}")
    return out


# SDPA backends tried in order on CUDA; the first that runs the shape is the one recorded
_CUDA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def _attention_runner(q, k, v) -> tuple[str, Callable[[], torch.Tensor]]:
    """(backend name, a call of causal SDPA pinned to it). On CPU torch has one fused kernel."""
    plain = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    if q.device.type != "cuda":
        return "cpu", plain
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name in _CUDA_BACKENDS:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue

        def pinned(backend=backend):
            with sdpa_kernel([backend]):
                return plain()

        try:
            pinned()
        except RuntimeError:  # this backend does not take the shape or dtype
            continue
        return name.removesuffix("_ATTENTION").lower(), pinned
    return "default", plain


def measure_attention(
    shapes: Iterable[tuple[int, int, int, int]], device: torch.device, dtype: torch.dtype, reps: int, tick=None
) -> list[AttentionTime]:
    """Causal SDPA of (batch, heads, seq, head_dim), forward and backward; forward FLOPs are the
    causal half of the two s x s products, 4 b h s^2 d / 2."""
    out = []
    for b, h, s, d in shapes:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        kernel, run = _attention_runner(q, k, v)
        fwd = median_time(lambda _: run(), device, reps)  # noqa: B023
        grad = torch.randn(b, h, s, d, device=device, dtype=dtype)
        bwd = median_time(lambda y: y.backward(grad), device, reps, before=run)  # noqa: B023
        flops = 2.0 * b * h * s * s * d
        out.append(
            AttentionTime(
                batch=b,
                heads=h,
                seq_len=s,
                head_dim=d,
                kernel=kernel,
                fwd_s=fwd,
                bwd_s=bwd,
                fwd_flops_per_s=flops / fwd,
            )
        )
        if tick:
            tick(f"attention s{s}")
    return out


def _adamw(tensors: int, numel: int, device):
    """An AdamW step over ``tensors`` fp32 parameters of ``numel`` elements, moments created."""
    params = [torch.zeros(numel, device=device, dtype=torch.float32, requires_grad=True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4)
    opt.step()  # creates the moments before timing
    return opt.step


def _passes(tokens: int, hidden: int, params: int, device, dtype):
    """(op, bytes moved, tensors, call) of each memory-bound pass: reads plus writes, as the cost
    model counts HBM traffic. AdamW on fp32 parameters reads parameter, gradient and both moments
    and writes parameter and moments: 7 x 4 bytes per parameter; it is timed on one large tensor
    and on many small ones, since a step pays a fixed cost per tensor besides its bytes."""
    size = torch.tensor([], dtype=dtype).element_size()
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w = torch.ones(hidden, device=device, dtype=dtype)
    a = torch.randn(tokens, 4 * hidden, device=device, dtype=dtype)
    b = torch.randn_like(a)
    dst = torch.empty_like(x)
    small = 1024
    return [
        ("norm", 2 * x.numel() * size, 1, lambda: rms_norm(x, w)),
        ("activation", 3 * a.numel() * size, 1, lambda: F.silu(a) * b),
        ("optimizer", 7 * 4 * params, 1, _adamw(1, params, device)),
        ("optimizer", 7 * 4 * small * 16, 16, _adamw(16, small, device)),
        ("optimizer", 7 * 4 * small, 1, _adamw(1, small, device)),
        ("copy", 2 * x.numel() * size, 1, lambda: dst.copy_(x)),
    ]


def measure_passes(tokens: int, hidden: int, params: int, device, dtype, reps: int, tick=None) -> list[PassTime]:
    out = []
    with torch.no_grad():
        for op, nbytes, tensors, call in _passes(tokens, hidden, params, device, dtype):
            t = median_time(lambda _: call(), device, max(reps, 5))  # noqa: B023
            out.append(PassTime(op=op, bytes=float(nbytes), tensors=tensors, time_s=t, bytes_per_s=nbytes / t))
            if tick:
                tick(f"pass {op}")
    return out
