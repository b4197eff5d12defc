"""One rank's training loop, and the single-process reference it is compared with.

Each step: 1F1B over the replica's micro-batches, gradient sync (``data``), AdamW (or, under ZeRO
or bf16, ``zero``'s reduce-scatter, sharded AdamW and all-gather), timed and
its memory counted by ``measure`` (the instrumentation only watches: the math is unchanged). The loss of a
micro-batch is summed over its tokens and scaled by 1 / (tokens in the whole step), so summed
gradients are the gradient of the batch mean and replicas of different local batches weigh by
their samples. ``weighted=False`` scales each replica by 1 / (its tokens x replicas) instead: the
plain mean of replica gradients, wrong when local batches differ.
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
from ntp_planner.executor.parallel.data import sync_gradients
from ntp_planner.executor.parallel.pipeline import one_f_one_b
from ntp_planner.executor.parallel.zero import (
    ADAMW,
    MASTER_DTYPE,
    ShardedOptimizer,
    default_dtype,
    uses_engine,
)
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.stage import StageModel


def loss_scale(spec: RunSpec, replica: int) -> float:
    if spec.weighted:
        return 1.0 / (spec.total_sequences * spec.seq_len)
    local = spec.replicas[replica].micro_batches * spec.micro_batch
    return 1.0 / (local * spec.seq_len * spec.data_replicas)


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
    replica, s = spec.locate(rank)
    ref = Reference(spec.cfg, seed=spec.seed)
    shapes = {k: v.shape for k, v in ref.named_parameters()}
    model = StageModel(spec, spec.replicas[replica].stages[s], rank, ref, comm, device)
    tokens, targets = (t.to(device) for t in synthetic_batch(spec))
    engine = ShardedOptimizer(spec, model, ref, comm) if uses_engine(spec) else None
    weights = [t for *_, t in model.named_parameters()]
    opt = engine or torch.optim.AdamW(weights, lr=spec.lr, **ADAMW)
    scale = loss_scale(spec, replica)
    clock, meter = StepClock(comm), ActivationMeter([*weights, tokens, targets])
    losses = []
    for step in range(spec.steps):
        if progress is not None:
            progress[3 * rank] = step + 1  # steps counted from 1 in reports
        _inject(fault, rank, step)
        if step == 1:  # memory peaks over the steady steps
            meter.reset_peak()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
        clock.start()
        with clock.optimizer():
            opt.zero_grad()
        with meter.hooks():
            share = one_f_one_b(model, spec, replica, s, rank, comm, (tokens, targets), scale)
            share += model.take_aux()  # MoE layers' load-balancing loss, part of the loss
        with comm.category("dp"):
            engine.reduce() if engine else sync_gradients(model, spec, s, comm, shapes)
        if step == 0:
            with clock.excluded():
                if engine:  # the synced gradient, rebuilt from the shards
                    synced = engine.synced_grads()
                    first_grads = [synced(name).detach().cpu().clone() for name, *_ in model.named_parameters()]
                else:
                    first_grads = [p.grad.detach().cpu().clone() for p in weights]
        with clock.optimizer():
            opt.step()
        if engine:
            with comm.category("dp"):
                engine.gather()
        if device.type == "cuda":
            torch.cuda.synchronize()
        clock.stop()
        losses.append(comm.world_reduce(torch.tensor([share], device=device)).item())
    if engine:
        engine.materialize()
    memory = rank_memory(weights, opt, meter, device, engine)  # before the gather's buffers join the CUDA peak
    held = comm.gather_objects(holdings(model, spec, rank, first_grads))
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
