"""What ``ntp profile`` shows: rich tables of a profile, and its summary for ``--json``. No torch."""

from __future__ import annotations

from cost_models.profile import Profile


def profile_summary(profile: Profile) -> dict:
    best = max(profile.gemms, key=lambda g: g.flops_per_s) if profile.gemms else None
    return {
        "device": profile.device.model_dump(mode="json"),
        "dtype": profile.dtype,
        "model": profile.model,
        "gemm_peak_flops_per_s": best.flops_per_s if best else None,
        "pass_bytes_per_s": {p.op: p.bytes_per_s for p in profile.passes},
        "blocks": [
            {
                "kind": b.shape.kind,
                "tp": b.shape.tp,
                "seq_len": b.shape.seq_len,
                "micro_batch": b.micro_batch,
                "fwd_s": b.fwd_s,
                "bwd_s": b.bwd_s,
            }
            for b in profile.blocks
        ],  # fmt: skip
        "collective_fits": [f.model_dump(mode="json") for f in profile.collective_fits],
        "notes": list(profile.notes),
    }


def profile_view(profile: Profile):
    from rich.console import Group
    from rich.table import Table

    d = profile.device
    head = f"{d.name} ({d.gpu}) x {d.count}, {d.backend}, {profile.dtype}, torch {d.torch_version}"
    blocks = Table(title=f"Blocks of {profile.model} (one TP rank, communication excluded)")
    for col in ("block", "tp", "seq", "micro-batch", "forward ms", "backward ms"):
        blocks.add_column(col, justify="left" if col == "block" else "right")
    for b in profile.blocks:
        s = b.shape
        blocks.add_row(
            s.kind, str(s.tp), str(s.seq_len), str(b.micro_batch), f"{b.fwd_s * 1e3:.3f}", f"{b.bwd_s * 1e3:.3f}"
        )
    fits = Table(title="Collectives: time = alpha + bytes / bandwidth")
    for col in ("operation", "group", "alpha us", "bandwidth GB/s", "worst residual"):
        fits.add_column(col, justify="left" if col == "operation" else "right")
    for f in profile.collective_fits:
        fits.add_row(
            f.op,
            str(f.group_size),
            f"{f.alpha_s * 1e6:.1f}",
            f"{f.bw_bytes_per_s / 1e9:.2f}",
            f"{f.max_rel_residual:.0%}",
        )
    rates = Table(title="Kernels")
    rates.add_column("kernel")
    rates.add_column("rate", justify="right")
    if profile.gemms:
        g = max(profile.gemms, key=lambda g: g.flops_per_s)
        rates.add_row(f"GEMM peak ({g.m}x{g.n}x{g.k})", f"{g.flops_per_s / 1e12:.3f} TFLOP/s")
    for a in profile.attention:
        rates.add_row(f"attention {a.kernel} b{a.batch} s{a.seq_len}", f"{a.fwd_flops_per_s / 1e12:.3f} TFLOP/s")
    for p in profile.passes:
        rates.add_row(f"{p.op} pass", f"{p.bytes_per_s / 1e9:.2f} GB/s")
    parts = [head, blocks, rates] + ([fits] if profile.collective_fits else [])
    return Group(*parts, *(f"note: {n}" for n in profile.notes))
