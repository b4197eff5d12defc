"""One rank's expert-parallel share of a mixture-of-experts layer (``model.moe`` is the plain one).

Expert parallelism: the ``ep`` ranks of an EP group (``groups.ep_group``) own ``experts / ep``
consecutive experts each. A rank sorts its (token, slot) pairs by expert, exchanges per-expert
counts, sends each row to its expert's owner with one ``all_to_all_single`` (gloo supports it
on CPU, uneven splits included, in torch 2.13), the owner runs its experts and a second
all-to-all returns the rows; the backward runs the two exchanges in reverse. Inside TP, experts
are cut like the dense MLP along their width at the layer's degree (the cost model's
``expert / (t * ep)`` parameters per GPU), so a rank's combined output is a TP partial like
``rank_mlp``'s, summed by the layer's TP all-reduce. The router is replicated over TP; its
gradient reaches each TP rank whole (``rank_moe``).

Parallel folding (``RunSpec.etp``): the experts' own grid etp x ep x edp over the stage's ranks
(``groups.expert_seat``); each expert cut over ``etp`` ranks. With etp < t the copy's t TP ranks
form t / etp expert-TP groups, and each dispatches its own contiguous share of the copy's tokens
(``_token_share``); the TP all-reduce then adds the shares (zeros elsewhere) and the width
partials alike. Explicit hosting (``RunSpec.hosting``, after a failure) gives each EP rank any
set of whole experts (``ExpertPlace.owned``): rows go out sorted by owner, then expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ntp_planner.executor.model.activations import swiglu
from ntp_planner.executor.model.moe import route, sequence_aux
from ntp_planner.executor.parallel.comm import Comm, CopyToTP
from ntp_planner.executor.parallel.ownership import contiguous
from ntp_planner.executor.spec import TinyConfig


# ---- autograd pieces -------------------------------------------------------------------------
class AllToAll(torch.autograd.Function):
    """Rows of ``x`` in blocks of ``send`` sizes to the ranks of the EP group (in order); the
    result holds ``recv`` sizes from each. Backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, comm: Comm, ranks, send: list[int], recv: list[int]):
        ctx.args = comm, ranks, send, recv
        return comm.all_to_all(x, ranks, send, recv)

    @staticmethod
    def backward(ctx, grad):
        comm, ranks, send, recv = ctx.args
        return comm.all_to_all(grad, ranks, recv, send), None, None, None, None


class AttachAux(torch.autograd.Function):
    """Identity on ``y``; backward also starts ``aux``'s backward (gradient 1), so the aux loss
    of a layer in the middle of a pipeline trains with the loss at its end. Its value goes to
    ``sink`` in backward: once per micro-batch even when recompute reruns the forward."""

    @staticmethod
    def forward(ctx, y, aux, sink: list | None):
        ctx.value, ctx.sink, ctx.like = aux.item(), sink, aux.detach()
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        if ctx.sink is not None:
            ctx.sink.append(ctx.value)
        return grad, torch.ones_like(ctx.like), None


class ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``scale`` backward."""

    @staticmethod
    def forward(ctx, x, scale: float):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


# ---- one rank's share ------------------------------------------------------------------------
@dataclass(frozen=True)
class ExpertPlace:
    """Where a rank stands for its MoE layers."""

    cfg: TinyConfig
    comm: Comm
    ep_ranks: tuple[int, ...]  # its EP group in rank order; the i-th owns experts block i
    ep_rank: int
    cp_ranks: tuple[int, ...]  # the ranks holding the other chunks of its sequences (cp)
    seq_len: int  # tokens of a whole sequence
    owned: tuple[tuple[int, ...], ...] = ()  # per EP rank its experts, ascending; () = consecutive blocks
    etp: int | None = None  # ranks splitting each expert's width (parallel folding); None = the layer's TP

    @property
    def hosts(self) -> tuple[tuple[int, ...], ...]:
        """The experts of every EP rank (``owned``, or ``experts / ep`` consecutive ones each)."""
        if self.owned:
            return self.owned
        per = self.cfg.experts // len(self.ep_ranks)
        return tuple(tuple(range(i * per, (i + 1) * per)) for i in range(len(self.ep_ranks)))


def rank_moe(h, route_in, p: dict, place: ExpertPlace, tp_ranks, router_scale: float, aux_scale: float, sink=None):
    """This TP rank's partial MoE output for ``h`` [rows, tokens, hidden] (its experts' width
    slice; summed over TP like ``rank_mlp``'s). ``route_in`` feeds the router: the normed stream
    before the TP copy, whose gradient each TP rank then takes whole (``router_scale`` 1), or the
    gathered stream under sequence parallelism, with ``router_scale`` 1 / t so that the TP sum of
    the router's and the input's gradients counts them once. The combine weights' gradient is
    summed over TP (their products with the partial outputs are partial). ``aux_scale``: the
    loss scale (1 / tokens in the step, ``step.loss_scale``) that makes this chunk's aux piece
    add up with the others' to aux_coeff x mean L_s."""
    cfg, comm = place.cfg, place.comm
    logits = route_in @ p["router"].T
    if router_scale != 1:
        logits = ScaleGrad.apply(logits, router_scale)
    weights, experts = route(logits, cfg.top_k)
    weights = CopyToTP.apply(weights, comm, tp_ranks)
    x = h.reshape(-1, cfg.hidden)
    a, b = _token_share(x.shape[0], place, tp_ranks)
    w, e = weights.reshape(-1, cfg.top_k)[a:b], experts.reshape(-1, cfg.top_k)[a:b]
    y = _dispatch_combine(x[a:b], w, e, p, place)
    if (a, b) != (0, x.shape[0]):  # the other TP ranks' tokens: their outputs come in the TP sum
        y = torch.cat([y.new_zeros(a, cfg.hidden), y, y.new_zeros(x.shape[0] - b, cfg.hidden)])
    y = y.view_as(h)
    if cfg.shared_ffn:
        y = y + swiglu(h, p["shared_gate"], p["shared_up"], p["shared_down"])
    pieces = sequence_aux(logits, experts, place.seq_len, lambda c: comm.all_reduce(c, place.cp_ranks, "cp"))
    aux = cfg.aux_coeff * place.seq_len * aux_scale * pieces.sum()
    return AttachAux.apply(y, aux, sink)


def _token_share(rows: int, place: ExpertPlace, tp_ranks) -> tuple[int, int]:
    """[a, b) of the copy's token rows this rank dispatches: all of them when each expert is cut
    over the layer's TP ranks (etp = t); with etp < t the t / etp expert-TP groups of the copy
    each take a contiguous share (Megatron's folded layout: each etp group its own tokens)."""
    t = len(tp_ranks)
    if place.etp is None or place.etp == t:
        return 0, rows
    share = tp_ranks.index(place.comm.rank) // place.etp
    return contiguous(rows, t // place.etp)[share]


def _dispatch_combine(x, weights, experts, p: dict, place: ExpertPlace) -> torch.Tensor:
    """sum_k weights[n, k] * expert_{experts[n, k]}(x[n]) for every token n, the experts run by
    their owners: rows sorted by owner, then expert, go out in one all-to-all and come back in
    another."""
    cfg, comm, ranks = place.cfg, place.comm, place.ep_ranks
    ep, k, hosts = len(ranks), experts.shape[1], place.hosts
    sequence = [e for es in hosts for e in es]  # experts by owner, then id
    rank_of = torch.empty(cfg.experts, dtype=torch.long, device=x.device)
    rank_of[torch.tensor(sequence, device=x.device)] = torch.arange(cfg.experts, device=x.device)
    flat = experts.reshape(-1)
    order = torch.argsort(rank_of[flat], stable=True)  # (token, slot) pairs grouped by owner, then expert
    token = order // k
    counts = torch.bincount(flat, minlength=cfg.experts)[torch.tensor(sequence, device=x.device)]
    sizes, mine = [len(es) for es in hosts], len(hosts[place.ep_rank])
    if ep > 1:
        got = comm.all_to_all(counts, ranks, sizes, [mine] * ep)  # per source: its rows for my experts
        recv = got.view(ep, mine)
        send_sizes = [int(c.sum()) for c in counts.split(sizes)]
        recv_sizes = recv.sum(1).tolist()
        rows = AllToAll.apply(x[token], comm, ranks, send_sizes, recv_sizes)
    else:
        recv, rows = counts.view(1, mine), x[token]
    out = _local_experts(rows, recv, p)
    if ep > 1:
        out = AllToAll.apply(out, comm, ranks, recv_sizes, send_sizes)
    w = weights.reshape(-1)[order]
    return x.new_zeros(x.shape).index_add(0, token, out * w[:, None])


def _local_experts(rows: torch.Tensor, counts: torch.Tensor, p: dict) -> torch.Tensor:
    """Each owned expert on its rows; ``rows`` come source by source, each source's by expert
    (``counts`` [sources, owned experts]); the result is in the same order."""
    sources, per = counts.shape
    if per == 0:  # a rank that holds no experts (all re-hosted elsewhere) gets no rows
        return rows
    sizes = counts.reshape(-1).tolist()
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    picks, outs = [], []
    for e in range(per):
        blocks = [(starts[s * per + e], sizes[s * per + e]) for s in range(sources)]
        idx = torch.cat([torch.arange(a, a + n, device=rows.device) for a, n in blocks])
        picks.append(idx)
        outs.append(swiglu(rows[idx], p["expert_gate"][e], p["expert_up"][e], p["expert_down"][e]))
    perm = torch.cat(picks)
    return torch.cat(outs)[torch.argsort(perm)]
