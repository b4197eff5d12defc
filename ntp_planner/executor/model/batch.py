"""The synthetic batch every step trains on, and the vocabulary it covers.

A bug at a TP boundary of the vocabulary (an embedding mask off by one, a logit column put on
the wrong rank) shows only when the ids on both sides of the boundary are in the batch, and
random ids miss part of a vocabulary larger than the batch. So the ids at the positions that
are both an input and a target (every position of a sequence but its first and its last) are
dealt, not drawn: first the ids on both sides of every vocabulary cut the run uses and the first
and last id, then every other id in random order, then random ids; the dealt positions are then
shuffled. A batch with at least ``vocab`` such positions has every id as an input and a target
(``covers_vocabulary``); a smaller one still has every boundary id while it has room for them.
The batch is the same in every step, so the losses fall as the model learns it, and the
first step's gradients already see every id. The reference trains on the same batch.

Worked example: 2 sequences of 9 tokens (10 ids each, targets shifted by one) deal 2 x 8 = 16
positions, enough for a 16-id vocabulary; cut at degree 3 it has boundaries at 6 and 11:

>>> from ntp_planner.executor.spec import TinyConfig, make_spec
>>> spec = make_spec(TinyConfig(vocab=16), [[3, 3, 3, 3]], [([3], 2)], 1, 9)
>>> boundary_ids(spec), dealt_positions(spec), covers_vocabulary(spec), missing_ids(spec), covering_seq_len(spec)
([0, 5, 6, 10, 11, 15], 16, True, ([], []), 9)
"""

from __future__ import annotations

import math

import torch

from ntp_planner.executor.parallel.ownership import vocab_shards
from ntp_planner.executor.spec import RunSpec


def dealt_positions(spec: RunSpec) -> int:
    """Positions of the batch that are both an input and a target: (seq_len - 1) per sequence."""
    return spec.total_sequences * (spec.seq_len - 1)


def covers_vocabulary(spec: RunSpec) -> bool:
    """Whether the batch has every vocabulary id as an input and as a target."""
    return dealt_positions(spec) >= spec.cfg.vocab


def covering_seq_len(spec: RunSpec) -> int:
    """The shortest sequence with which the batch covers the vocabulary (the same sequences),
    rounded up to a length the cost model also accepts for the run (``validate --profile``
    predicts it): a multiple of 2 cp under context parallelism, and of cp x the widest stage
    under sequence parallelism.

    >>> from ntp_planner.executor.spec import TinyConfig, make_spec
    >>> covering_seq_len(make_spec(TinyConfig(vocab=64), [[2, 2, 2, 2]], [([2], 2)], 1, 8, sequence_parallel=True))
    34
    """
    need = -(-spec.cfg.vocab // spec.total_sequences) + 1
    widest = max(st.width for rep in spec.replicas for st in rep.stages)
    unit = math.lcm(2 * spec.cp if spec.cp > 1 else 1, spec.cp * widest if spec.sequence_parallel else 1)
    return -(-need // unit) * unit


def boundary_ids(spec: RunSpec) -> list[int]:
    """The ids on both sides of every vocabulary cut of the embedding and LM head blocks, and
    the first and last id."""
    vocab = spec.cfg.vocab
    degrees = {b.degree for rep in spec.replicas for st in rep.stages for b in st.blocks if b.kind != "layer"}
    cuts = {a for t in degrees for a, _ in vocab_shards(vocab, t)[1:]}
    return sorted({0, vocab - 1} | {i for a in cuts for i in (a - 1, a)})


def synthetic_batch(spec: RunSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), each [total_sequences, seq_len], targets shifted by one; the same on
    every rank and for the reference (seeded by ``spec.seed``)."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    rows, seq, vocab = spec.total_sequences, spec.seq_len, spec.cfg.vocab
    ids = torch.randint(0, vocab, (rows, seq + 1), generator=g)
    first = boundary_ids(spec)
    rest = torch.tensor(sorted(set(range(vocab)) - set(first)), dtype=torch.long)
    order = torch.cat([torch.tensor(first, dtype=torch.long), rest[torch.randperm(len(rest), generator=g)]])
    dealt = ids[:, 1:seq].reshape(-1)  # a copy: dealt, shuffled, then written back
    n = min(len(dealt), len(order))
    dealt[:n] = order[:n]
    ids[:, 1:seq] = dealt[torch.randperm(len(dealt), generator=g)].view(rows, seq - 1)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def sample_rows(spec: RunSpec, first: int, count: int) -> torch.Tensor:
    """Rows of the synthetic batch (the sample pool of a live run) that samples first .. first +
    count - 1 are: sample ``s`` is row ``s mod total_sequences``, so a stream of steps of any batch
    size walks the pool in order. The live run and its single-process reference both read it."""
    return (torch.arange(first, first + count) % spec.total_sequences).long()


def missing_ids(spec: RunSpec) -> tuple[list[int], list[int]]:
    """Vocabulary ids that the batch does not have as an input, and those it lacks as a target."""
    tokens, targets = synthetic_batch(spec)
    everything = set(range(spec.cfg.vocab))
    return sorted(everything - set(tokens.flatten().tolist())), sorted(everything - set(targets.flatten().tolist()))


def stream_draws(steps: list[dict], total_steps: int, batches: list[int]) -> tuple[list[tuple[int, int]], list[str]]:
    """The samples the reference draws, step by step, from the stream, and how a live run's
    committed log (``steps``: step, generation, consumed, batch, in commit order) differs from it.

    The reference does not take the run's word for which samples a step used: step k draws the
    next ``batches[generation]`` samples (the sequences per step of the layout the coordinator
    published for that generation) after those of steps 0..k-1. The run's log must be that
    stream: steps 0..total_steps-1, each once and in order, each starting where the one before
    ended, with its layout's batch; anything else (a sample skipped or used twice, a step lost
    or applied twice) is a sentence of the returned list, and fails the run.

    >>> log = [dict(step=0, generation=0, consumed=0, batch=4), dict(step=1, generation=1, consumed=4, batch=3)]
    >>> stream_draws(log, 2, [4, 3])
    ([(0, 4), (4, 3)], [])
    >>> stream_draws([log[0], dict(log[1], consumed=5)], 3, [4, 3])[1]  # doctest: +NORMALIZE_WHITESPACE
    ['the run committed steps 0-1, not steps 0-2 once each in order',
     'step 1 committed samples 5..7, but the stream continues at sample 4 with 3 samples']
    """
    draws, problems, first = [], [], 0
    got = [r["step"] for r in steps]
    if got != list(range(total_steps)):
        problems.append(f"the run committed {_step_list(got)}, not {_step_list(list(range(total_steps)))} "
                        "once each in order")  # fmt: skip
    for r in steps:
        batch = batches[r["generation"]]
        draws.append((first, batch))
        if (r["consumed"], r["batch"]) != (first, batch) and len(problems) < 3:
            problems.append(
                f"step {r['step']} committed samples {r['consumed']}..{r['consumed'] + r['batch'] - 1}, but the "
                f"stream continues at sample {first} with {batch} samples"
            )
        first += batch
    return draws, problems


def _step_list(steps: list[int]) -> str:
    """'steps 0-3', 'steps 0, 1, 1, 2' or 'no step'."""
    if not steps:
        return "no step"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ", ".join(map(str, steps))
