"""Planted bugs, for tests that prove the exactness check catches them. The package knows
nothing of them: each bug swaps one function of the package (where the bug would live) for a
buggy variant, in the test process (``plant``, undone after the test) and in every rank the
launcher starts (the ``worker_init`` that ``plant`` returns, which ``launch`` and
``launch_live`` run in each process before it trains). Ranks fork from a server started
earlier (``train.processes``), so a patch in the test process alone would not reach them.
Planted bugs are for spawned runs only: a torchrun rank runs no ``worker_init``.

The bugs: ``doubled-grad-copy1`` and ``nan-grad-copy1`` (``data.sync_gradients``: copy 1 of a
block keeps twice its synced gradient, or a NaN in it), ``ntp-core-doubled`` (``data.ntp_core``,
the path ZeRO shares: core rank 0 doubles its replica's part), ``cuts-reversed`` (``ownership``:
fuller ranks last; ``cuts-reversed-odd`` only at odd degrees, which a TP4 run reaches only by a
re-plan), ``embed-mask-off-by-one`` (``stage``: a rank also looks up the first id of the next
rank's vocabulary rows), ``row-bias-twice`` (``stage``: the bias on every TP rank's partial),
``chunk-layers-reversed`` (``stage``: a chunk's layers run backwards), ``moe-combine-wrong-weight``
(``moe``: each token's top-2 weights swapped), ``zero-shard-offset`` (``zero``: a rank updates
its neighbour's shard), ``live-crash-proc3`` (``worker``: process 3 raises in step 1, a crash no
--fail injected) and ``skip-a-sample`` (``coordinator``: the layout after a failure starts one
sample late).

>>> sorted(BUGS)[:3]
['chunk-layers-reversed', 'cuts-reversed', 'cuts-reversed-odd']
"""

from __future__ import annotations

import importlib
import sys
from functools import partial

OWNERSHIP = "ntp_planner.executor.parallel.ownership"
DATA = "ntp_planner.executor.parallel.data"
STAGE = "ntp_planner.executor.train.stage"
EXPERT = "ntp_planner.executor.parallel.expert"
ZERO = "ntp_planner.executor.parallel.zero"
WORKER = "ntp_planner.executor.elastic.worker"
COORDINATOR = "ntp_planner.executor.elastic.coordinator"


def _swap(patch, module: str, name: str, make, everywhere: bool = True) -> None:
    """Replace function ``name`` of ``module`` by ``make(original)``, and (``everywhere``) in
    every loaded module of ours that imported it by name (``from data import sync_gradients``),
    so callers see the variant however they reach it."""
    mod = importlib.import_module(module)
    original = getattr(mod, name)
    variant = make(original)
    holders = [m for k, m in list(sys.modules.items()) if k.startswith("ntp_planner.")] if everywhere else [mod]
    for m in holders:
        if getattr(m, name, None) is original:
            patch(m, name, variant)


def _swap_method(patch, module: str, cls: str, name: str, make) -> None:
    """Replace method ``name`` of class ``cls`` (of ``module``) by ``make(original)``."""
    klass = getattr(importlib.import_module(module), cls)
    patch(klass, name, make(klass.__dict__[name]))


def _copy1_grads(change):
    """``sync_gradients`` followed by ``change(grad)`` on every gradient copy 1 of a block holds."""

    def make(sync):
        def buggy(model, *args, **kw):
            sync(model, *args, **kw)
            for *_, bs, p in model.named_parameters():
                if bs.copy == 1:
                    p.grad = change(p.grad)

        return buggy

    return make


def _nan_first(grad):
    grad.view(-1)[0] = float("nan")  # one NaN in every synced gradient of copy 1 (AdamW spreads it)
    return grad


def _core_doubled(ntp_core):
    def buggy(model, spec, key, bs, *args):
        core = ntp_core(model, spec, key, bs, *args)
        return core * 2 if core is not None and bs.tp_rank == 0 else core

    return buggy


def _shares_reversed(odd_only: bool):
    def make(uneven_shares):
        def buggy(units: int, degree: int):
            shares = uneven_shares(units, degree)
            return shares[::-1] if degree % 2 == 1 or not odd_only else shares

        return buggy

    return make


def _embed_off_by_one(_original):
    from ntp_planner.executor.parallel.ownership import vocab_shards

    def buggy(self, bs, tokens):  # ``StageModel._embed_partial`` with ``<=`` for ``<`` at the end
        a, b = vocab_shards(self.cfg.vocab, bs.block.degree)[bs.tp_rank]
        mine = (tokens >= a) & (tokens <= b)
        return bs.params["embed"][(tokens - a).clamp(0, b - a - 1)] * mine[..., None]

    return buggy


def _bias_twice(_original):
    from ntp_planner.executor.model.reference import add_bias

    return staticmethod(lambda partial, p, key, reduce: reduce(add_bias(partial, p, key)))


def _chunk_reversed(chunk):
    def buggy(self, v: int):
        blocks = chunk(self, v)
        layers = iter([bs for bs in blocks if bs.block.kind == "layer"][::-1])
        return [next(layers) if bs.block.kind == "layer" else bs for bs in blocks]

    return buggy


def _weights_flipped(dispatch_combine):
    return lambda x, weights, *args: dispatch_combine(x, weights.flip(-1), *args)


def _neighbours_shard(shard_bounds):
    return lambda numel, group, index: shard_bounds(numel, group, (index + 1) % group if group > 1 else index)


def _crash_proc3(injector):
    def buggy(faults, proc: int, step: int, *args):
        if proc == 3 and step == 1:  # a bug of ours, not a --fail
            raise RuntimeError("planted bug: process 3 crashes in step 1")
        return injector(faults, proc, step, *args)

    return buggy


def _one_sample_late(consumed):
    return lambda self: consumed(self) + 1 if self.effective() else 0


BUGS = {
    "doubled-grad-copy1": lambda p: _swap(p, DATA, "sync_gradients", _copy1_grads(lambda g: g * 2)),
    "nan-grad-copy1": lambda p: _swap(p, DATA, "sync_gradients", _copy1_grads(_nan_first)),
    "ntp-core-doubled": lambda p: _swap(p, DATA, "ntp_core", _core_doubled),
    "cuts-reversed": lambda p: _swap(p, OWNERSHIP, "uneven_shares", _shares_reversed(False), everywhere=False),
    "cuts-reversed-odd": lambda p: _swap(p, OWNERSHIP, "uneven_shares", _shares_reversed(True), everywhere=False),
    "embed-mask-off-by-one": lambda p: _swap_method(p, STAGE, "StageModel", "_embed_partial", _embed_off_by_one),
    "row-bias-twice": lambda p: _swap_method(p, STAGE, "StageModel", "_row_parallel", _bias_twice),
    "chunk-layers-reversed": lambda p: _swap_method(p, STAGE, "StageModel", "chunk", _chunk_reversed),
    "moe-combine-wrong-weight": lambda p: _swap(p, EXPERT, "_dispatch_combine", _weights_flipped),
    "zero-shard-offset": lambda p: _swap(p, ZERO, "shard_bounds", _neighbours_shard),
    "live-crash-proc3": lambda p: _swap(p, WORKER, "_injector", _crash_proc3),
    "skip-a-sample": lambda p: _swap_method(p, COORDINATOR, "Coordinator", "_consumed", _one_sample_late),
}


def install(name: str, patch=setattr) -> None:
    """Plant bug ``name`` in this process for good (``patch`` = ``setattr``): a rank's
    ``worker_init`` (``partial(install, name)`` pickles by reference)."""
    BUGS[name](patch)


def plant(monkeypatch, name: str):
    """Plant bug ``name`` in the test process (undone after the test) and return the
    ``worker_init`` that plants it in every process the launcher starts."""
    install(name, monkeypatch.setattr)
    return partial(install, name)
