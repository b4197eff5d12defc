"""One training step, the one every loop runs: the launcher's (``runtime.run_rank``) and live
recovery's (``elastic.worker``), so that what the live run proves exact is the step the plan runs.

``build`` makes a rank's training objects from its RunSpec: the comm, its ``StageModel`` and the
optimizer (plain AdamW, or ``zero.ShardedOptimizer`` for ZeRO 1-3 and mixed precision).
``train_step`` runs one step on them: 1F1B over the replica's micro-batches, the gradient sync
(``data``, or the engine's reduce-scatter), then ``before_optimizer`` (a hook: the launcher takes
the first step's gradients there, the live worker fires its injected faults and votes; raising
skips the optimizer, so a step the vote aborts changes nothing), AdamW and the engine's
all-gather. The clock and the activation meter only watch (``measure``): the math is unchanged.

The loss of a micro-batch is summed over its tokens and scaled by 1 / (tokens in the whole
step), so summed gradients are the gradient of the batch mean and replicas of different local
batches weigh by their samples. ``weighted=False`` scales each replica by 1 / (its tokens x
replicas) instead: the plain mean of replica gradients, wrong when local batches differ.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.parallel.comm import Comm
from ntp_planner.executor.parallel.data import sync_gradients
from ntp_planner.executor.parallel.pipeline import one_f_one_b
from ntp_planner.executor.parallel.zero import ADAMW, ShardedOptimizer, uses_engine
from ntp_planner.executor.spec import RunSpec
from ntp_planner.executor.train.stage import StageModel


def loss_scale(spec: RunSpec, replica: int) -> float:
    if spec.weighted:
        return 1.0 / (spec.total_sequences * spec.seq_len)
    local = spec.replicas[replica].micro_batches * spec.micro_batch
    return 1.0 / (local * spec.seq_len * spec.data_replicas)


@dataclass(frozen=True)
class Trainer:
    """One rank's training objects (built by ``build``; the tensors inside change, the objects do not)."""

    spec: RunSpec
    rank: int
    replica: int
    stage: int
    comm: Comm
    model: StageModel
    engine: ShardedOptimizer | None  # ZeRO >= 1 or mixed precision; None: ``opt`` is plain AdamW
    opt: object  # what ``zero_grad`` and ``step`` are called on: the engine or torch's AdamW
    shapes: dict  # reference name -> full shape (the gradient sync's)
    scale: float  # the loss scale (``loss_scale``)
    device: torch.device

    @property
    def weights(self) -> list[torch.Tensor]:
        return [t for *_, t in self.model.named_parameters()]


def build(spec: RunSpec, rank: int, comm: Comm, device: torch.device) -> Trainer:
    """The rank's model sliced from the seeded reference and its optimizer (the default process
    group is this run's)."""
    replica, s = spec.locate(rank)
    ref = Reference(spec.cfg, seed=spec.seed)
    shapes = {k: v.shape for k, v in ref.named_parameters()}
    model = StageModel(spec, spec.replicas[replica].stages[s], rank, ref, comm, device)
    engine = ShardedOptimizer(spec, model, ref, comm) if uses_engine(spec) else None
    opt = engine or torch.optim.AdamW([t for *_, t in model.named_parameters()], lr=spec.lr, **ADAMW)
    return Trainer(spec, rank, replica, s, comm, model, engine, opt, shapes, loss_scale(spec, replica), device)


class _Still:
    """The clock of a loop that does not time its steps."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def optimizer(self):
        return nullcontext()


def train_step(
    tr: Trainer,
    batch: tuple[torch.Tensor, torch.Tensor],
    before_optimizer: Callable[[float], None] | None = None,
    clock=None,
    meter=None,
) -> float:
    """One step on ``batch`` (the step's tokens and targets, every replica's rows); returns this
    rank's share of the loss. ``before_optimizer(share)`` runs after the gradient sync; if it
    raises, the optimizer does not step. ``clock`` (``measure.StepClock``) and ``meter``
    (``measure.ActivationMeter``) watch when given."""
    clock = clock or _Still()
    spec, comm, model, engine = tr.spec, tr.comm, tr.model, tr.engine
    clock.start()
    with clock.optimizer():
        tr.opt.zero_grad()
    with meter.hooks() if meter is not None else nullcontext():
        share = one_f_one_b(model, spec, tr.replica, tr.stage, tr.rank, comm, batch, tr.scale)
        share += model.take_aux()  # MoE layers' load-balancing loss, part of the loss
    with comm.category("dp"):
        engine.reduce() if engine else sync_gradients(model, spec, tr.stage, comm, tr.shapes)
    if before_optimizer is not None:
        before_optimizer(share)
    with clock.optimizer():
        tr.opt.step()
    if engine:
        with comm.category("dp"):
            engine.gather()
    if tr.device.type == "cuda":
        torch.cuda.synchronize()
    clock.stop()
    return share


def synced_grads(tr: Trainer) -> list[torch.Tensor]:
    """Every parameter's synced gradient, on the CPU, in ``named_parameters`` order (between the
    sync and the optimizer; with an engine rebuilt from the shards: a collective every rank makes)."""
    if tr.engine is None:
        return [p.grad.detach().cpu().clone() for p in tr.weights]
    synced = tr.engine.synced_grads()
    return [synced(name).detach().cpu().clone() for name, *_ in tr.model.named_parameters()]
