"""One rank's training loop (the launcher's), and the single-process reference it is compared with.

Each step is ``step.train_step`` (1F1B, gradient sync or ZeRO's reduce-scatter, AdamW, all-gather),
timed and its memory counted by ``measure`` (the instrumentation only watches: the math is unchanged).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ntp_planner.executor.check.holders import holdings
from ntp_planner.executor.check.measure import ActivationMeter, StepClock, gather_rows, rank_memory
from ntp_planner.executor.model.batch import sample_rows, synthetic_batch
from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.parallel.comm import Comm
from ntp_planner.executor.parallel.zero import ADAMW, MASTER_DTYPE, default_dtype
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.step import build, synced_grads, train_step


def _inject(fault, rank: int, step: int) -> None:
    """Test hook: (rank, kind, step) makes that rank die, hang or raise at the start of a step."""
    if fault is None or fault[0] != rank or fault[2] != step:
        return
    if fault[1] == "die":
        os._exit(3)
    if fault[1] == "hang":
        time.sleep(10**6)
    raise RuntimeError(f"injected fault on rank {rank}")


def run_rank(rank: int, spec: RunSpec, init_method: str, backend: str, out_file: str, timeout_s: float,
             progress=None, fault=None) -> None:  # fmt: skip
    """Train ``spec.steps`` steps as process ``rank``; rank 0 writes losses, every rank's
    parameters and first-step gradients (``holders``), and every rank's step times, their split
    and memory (``measure``) to ``out_file``. ``progress[3 * rank]`` holds the step this rank has entered
    (then ``Comm`` its collectives)."""
    torch.set_num_threads(1)
    torch.set_default_dtype(default_dtype(spec))
    device = torch.device("cpu")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))  # torchrun sets it per host
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=spec.world_size, timeout=timedelta(seconds=timeout_s)
    )
    comm = Comm(spec, rank, progress, timedelta(seconds=timeout_s))
    tr = build(spec, rank, comm, device)
    tokens, targets = (t.to(device) for t in synthetic_batch(spec))
    engine, weights = tr.engine, tr.weights
    clock, meter = StepClock(comm), ActivationMeter([*weights, tokens, targets])
    losses, first_grads = [], []

    def keep_first_grads(share: float) -> None:
        if step == 0:
            with clock.excluded():
                first_grads.extend(synced_grads(tr))

    for step in range(spec.steps):
        if progress is not None:
            progress[3 * rank] = step + 1  # steps counted from 1 in reports
        _inject(fault, rank, step)
        if step == 1:  # memory peaks over the steady steps
            meter.reset_peak()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
        share = train_step(tr, (tokens, targets), keep_first_grads, clock, meter)
        losses.append(comm.world_reduce(torch.tensor([share], device=device)).item())
    if engine:
        engine.materialize()
    memory = rank_memory(weights, tr.opt, meter, device, engine)  # before the gather's buffers join the CUDA peak
    held = comm.gather_objects(holdings(tr.model, spec, rank, first_grads))
    row = [v for r in clock.rows for v in r] + memory
    stats = gather_rows(comm, row, rank, spec.world_size, device)
    if rank == 0:
        holders = [h for rank_held in held for h in rank_held]
        torch.save({"losses": losses, "holders": holders, "rank_stats": stats}, out_file)
    comm.world_reduce(torch.zeros(1, device=device))  # nobody leaves before rank 0 has written
    dist.destroy_process_group()


def reference_run(spec: RunSpec, samples: list[tuple[int, int]] | None = None, grad_step: int = 0,
                  device: str = "cpu") -> dict:  # fmt: skip
    """The same training in one process on the whole batch (mean over its tokens). With
    ``samples``, one step per (first sample, count) on exactly those samples of the pool (a live
    run's log: ``batch.sample_rows``), and the gradients reported are those of step ``grad_step``. In mixed
    precision (bf16) the model is a bf16 copy of fp32 master weights: its gradients become fp32,
    AdamW updates the masters and the copy is cast from them again; parameters are reported as
    the copy's, in fp32. ``device``: where it computes (a full-size model's reference on "cuda":
    the weights are made on the CPU, as the ranks make theirs, then moved); results on the CPU."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype(spec))
    try:
        return _reference(spec, samples, grad_step, torch.device(device))
    finally:
        torch.set_default_dtype(previous)


def _reference(spec: RunSpec, samples: list[tuple[int, int]] | None, grad_step: int, device: torch.device) -> dict:
    mixed = spec.dtype in MASTER_DTYPE
    master = Reference(spec.cfg, seed=spec.seed).to(device)
    model = Reference(spec.cfg, seed=spec.seed).to(device, getattr(torch, spec.dtype)) if mixed else master
    opt = torch.optim.AdamW(list(master.parameters()), lr=spec.lr, **ADAMW)
    tokens, targets = (t.to(device) for t in synthetic_batch(spec))
    if samples is None:
        samples = [(0, spec.total_sequences)] * spec.steps
    losses, grads = [], {}
    for step, (first, count) in enumerate(samples):
        rows = sample_rows(spec, first, count).to(device)
        model.zero_grad()
        loss = model.loss(tokens[rows], targets[rows])
        loss.backward()
        if mixed:
            for m, p in zip(master.parameters(), model.parameters(), strict=True):
                m.grad = p.grad.float()
        if step == grad_step:
            grads = {k: v.grad.cpu().clone() for k, v in master.named_parameters()}
        opt.step()
        if mixed:
            with torch.no_grad():
                for m, p in zip(master.parameters(), model.parameters(), strict=True):
                    p.copy_(m)
        losses.append(loss.item())
    dtype = torch.get_default_dtype()  # the masters' (fp32 in mixed precision)
    params = {k: v.detach().to("cpu", dtype, copy=True) for k, v in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}
