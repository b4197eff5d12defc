"""Start a live run and judge it: on one host (``launch_live``: the launcher hosts the store and
spawns every process) or under torchrun (``torchrun``, which reuses ``live_config`` and
``compare_live``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from ntp_planner.executor.elastic.coordinator import Coordinator, live_spec
from ntp_planner.executor.elastic.relayout import RunReplanner
from ntp_planner.executor.elastic.worker import LiveConfig


def live_config(shrunk, faults, checkpoint_every: int, checkpoint_dir: str, backend: str, timeout_s: float):
    """The shrunk run as live recovery trains it (``live_spec``) and what every process shares."""
    from ntp_planner.executor import checkpoint

    if checkpoint_dir and checkpoint.complete_steps(checkpoint_dir):
        # a fallback loads the newest complete checkpoint there: another run's would pass for this one's
        raise ValueError(f"checkpoint folder {checkpoint_dir} already holds checkpoints; give an empty one")
    shrunk = replace(shrunk, spec=live_spec(shrunk.spec))
    spec = shrunk.spec
    cfg = LiveConfig(
        base=spec,
        steps=spec.steps,
        backend=backend,
        timeout_s=timeout_s,
        faults=tuple(faults),
        checkpoint_every=checkpoint_every,
        checkpoint_dir=checkpoint_dir,
    )
    return shrunk, cfg


def launch_live(plan, shrunk, policy: str = "ntp", faults=(), repairs=(), spares: int = 0, checkpoint_every: int = 0,
                checkpoint_dir: str = "", backend: str = "gloo", timeout_s: float = 60.0, tick=None,
                worker_init=None):  # fmt: skip
    """Run ``shrunk`` (of ``plan``) live on this host with injected ``faults`` and ``repairs``,
    recovering under ``policy``; compare the final state with one process fed the samples the run
    committed. The store is a ``TCPStore`` this process hosts: a dying rank cannot take it down.
    ``worker_init``: called first in every process started (repairs too; a test's planted bug).
    Returns (``launch.Result``, ``LiveRun``)."""
    import torch.distributed as dist

    from ntp_planner.executor.elastic.hosts import LocalHosts

    shrunk, cfg = live_config(shrunk, faults, checkpoint_every, checkpoint_dir, backend, timeout_s)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s + 60)
    )
    replanner = RunReplanner(plan, shrunk, spares)
    hosts = LocalHosts(replanner.base().spec.world_size + spares, cfg, "127.0.0.1", store.port, worker_init)
    run = Coordinator(replanner, policy, cfg, store, hosts, spares, tuple(repairs), tick).run()
    return compare_live(shrunk.spec, run), run


def compare_live(spec, run):
    """The ``launch.Result`` of live run ``run``: its final holdings against one process fed the
    samples the run committed (the reference draws them from the stream itself; the run's log
    must be that stream)."""
    from ntp_planner.executor.check.holders import compare, loss_errors, non_finite_losses
    from ntp_planner.executor.model.batch import stream_draws
    from ntp_planner.executor.model.reference import zero_gradient_params
    from ntp_planner.executor.train.launch import Result
    from ntp_planner.executor.train.runtime import reference_run

    grad_step = -1 if run.grad_step is None else run.grad_step  # -1: no step's gradients
    draws, stream_problems = stream_draws(run.steps, spec.steps, run.batches)
    ref = reference_run(spec, draws, grad_step)
    losses = [r["loss"] for r in run.steps]
    zero = zero_gradient_params(spec.cfg)
    noise = frozenset(k for k in ref["grads"] if k.rsplit(".", 1)[-1] in zero)
    pairs = zip(run.steps, run.steps[1:], strict=False)
    gaps = [b["t"] - a["t"] for a, b in pairs if a["generation"] == b["generation"]]
    held = compare(run.holders, ref["params"], ref["grads"], noise)
    held["problems"] = stream_problems + non_finite_losses(losses, ref["losses"]) + held["problems"]
    return Result(
        losses=losses,
        reference_losses=ref["losses"],
        max_rel_error_loss=loss_errors(losses, ref["losses"]),
        wall_s=run.wall_s,
        step_time_s=sum(gaps) / len(gaps) if gaps else 0.0,
        **held,
    )
