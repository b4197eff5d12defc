"""Mixture-of-experts MLP: the plain reference (no communication).

Routing (Megatron's default, ``moe_router_pre_softmax`` off; the same as Mixtral's softmax,
top-k, renormalise): a replicated linear router gives each token ``experts`` logits, the top
``top_k`` are kept and a softmax over those k gives the combine weights. Each routed expert is a
SwiGLU MLP of width ``expert_ffn``; a shared expert (width ``shared_ffn``), when the model has
one, sees every token and its output is added. Dropless: every token reaches all its experts
(no capacity factor, no token dropping), in the reference and in the distributed run.

Load balancing (DeepSeek-V2's sequence-wise balance loss, Megatron's ``seq_aux_loss``): per
sequence s of T tokens, f_e = E / (k T) * (tokens of s routed to e) and P_e = (1 / T) * sum over
its tokens of softmax(logits)_e (over all E experts); L_s = sum_e f_e P_e (1 when balanced), and
the model's aux loss is ``aux_coeff`` times the mean of L_s over the batch's sequences, summed over
MoE layers. It decomposes exactly over any split of the batch by sequences (micro-batches, TP
copies, replicas). Context parallelism cuts a sequence: the f_e counts are summed over the cp
chunks (they carry no gradient), after which L_s is linear in each chunk's P_e sum, so the chunks'
pieces add up to L_s exactly. The classic batch-level Switch loss would need the whole step's
statistics all-reduced; this one does not.

One rank's expert-parallel share is ``parallel.expert``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ntp_planner.executor.model.activations import swiglu
from ntp_planner.executor.spec import TinyConfig

EXPERT_KEYS = ("expert_gate", "expert_up", "expert_down")  # [experts, width, hidden] / [experts, hidden, width]
SHARED_KEYS = ("shared_gate", "shared_up", "shared_down")


def moe_keys(cfg: TinyConfig) -> tuple[str, ...]:
    """Parameters of an MoE layer's MLP (in place of gate, up, down)."""
    return ("router", *EXPERT_KEYS, *(SHARED_KEYS if cfg.shared_ffn else ()))


def init_moe(layer: nn.Module, cfg: TinyConfig) -> None:
    """Give ``layer`` a router, the routed experts and the shared expert (if any)."""
    e, f, h = cfg.experts, cfg.expert_ffn, cfg.hidden
    layer.router = nn.Parameter(torch.randn(e, h) * 0.3)  # distinct logits: no near-ties in the top-k
    layer.expert_gate = nn.Parameter(torch.randn(e, f, h) * 0.1)
    layer.expert_up = nn.Parameter(torch.randn(e, f, h) * 0.1)
    layer.expert_down = nn.Parameter(torch.randn(e, h, f) * 0.1)
    if cfg.shared_ffn:
        layer.shared_gate = nn.Parameter(torch.randn(cfg.shared_ffn, h) * 0.1)
        layer.shared_up = nn.Parameter(torch.randn(cfg.shared_ffn, h) * 0.1)
        layer.shared_down = nn.Parameter(torch.randn(h, cfg.shared_ffn) * 0.1)


def route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(combine weights, experts), each [..., k]: the top-k logits, softmax over those k."""
    top, experts = logits.topk(k, dim=-1)
    return top.softmax(-1), experts


def sequence_aux(logits: torch.Tensor, experts: torch.Tensor, seq_len: int, sum_counts=None) -> torch.Tensor:
    """L_s of every sequence of ``logits`` [batch, tokens, E] routed to ``experts`` [batch,
    tokens, k]; ``seq_len`` = T, the whole sequence (a cp chunk holds fewer tokens);
    ``sum_counts`` adds the other chunks' expert counts [batch, E] in place.

    >>> logits = torch.tensor([[[3.0, 1.0], [2.0, 1.0]]]).log()  # softmax [.75, .25] and [2/3, 1/3]
    >>> round(sequence_aux(logits, logits.topk(1, dim=-1)[1], 2).item(), 6)  # both on expert 0: f = (2, 0)
    1.416667
    """
    e, k = logits.shape[-1], experts.shape[-1]
    counts = F.one_hot(experts, e).sum((-3, -2)).to(logits.dtype)  # [batch, E]
    if sum_counts is not None:
        sum_counts(counts)
    f = counts * e / (k * seq_len)
    return (f * logits.softmax(-1).sum(-2) / seq_len).sum(-1)


def moe_reference(h: torch.Tensor, layer: nn.Module, cfg: TinyConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(MLP output, aux loss of this layer: aux_coeff x the mean of L_s over the sequences) for
    the normed stream ``h`` [batch, seq, hidden], every expert in one process."""
    logits = h @ layer.router.T
    weights, experts = route(logits, cfg.top_k)
    x, w, chosen = h.reshape(-1, cfg.hidden), weights.reshape(-1, cfg.top_k), experts.reshape(-1, cfg.top_k)
    y = torch.zeros_like(x)
    for e in range(cfg.experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        out = swiglu(x[token], layer.expert_gate[e], layer.expert_up[e], layer.expert_down[e])
        y = y.index_add(0, token, out * w[token, slot, None])
    y = y.view_as(h)
    if cfg.shared_ffn:
        y = y + swiglu(h, layer.shared_gate, layer.shared_up, layer.shared_down)
    return y, cfg.aux_coeff * sequence_aux(logits, experts, h.shape[1]).mean()


def local_experts(cfg: TinyConfig, ep: int, ep_rank: int) -> slice:
    """The experts EP rank ``ep_rank`` of ``ep`` owns (a contiguous block)."""
    per = cfg.experts // ep
    return slice(ep_rank * per, (ep_rank + 1) * per)
