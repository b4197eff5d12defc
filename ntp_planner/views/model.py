"""The model's size as every command shows it: total and active parameters (``ModelSpec``'s
``params_total`` / ``params_active``, the model cards' convention), one line for tables and two
keys for ``--json``."""

from __future__ import annotations

from rich.text import Text

from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec


def billions(n: int) -> str:
    """>>> billions(671_026_419_200), billions(1_500_000)
    ('671.0B', '0.0B')"""
    return f"{n / 1e9:.1f}B"


def params_text(m: ModelSpec) -> str:
    """E.g. "mixtral-8x7b: 46.7B parameters, 12.9B active per token" (a dense model: all active)."""
    return f"{m.name}: {billions(m.params_total)} parameters, {billions(m.params_active)} active per token"


def params_line(m: ModelSpec) -> Text:
    return Text(params_text(m))


def params_json(m: ModelSpec) -> dict:
    """The keys every command's --json carries: exact integers."""
    return {"params_total": m.params_total, "params_active": m.params_active}


def experts_text(m: ModelSpec, layout: ParallelLayout) -> str | None:
    """The experts' grid of a stage and their dispatch, for an MoE model (None for a dense one).

    >>> from cost_models import MODELS
    >>> experts_text(MODELS["mixtral-8x7b"], ParallelLayout(tp=4, dp=4, ep=8, etp=1, global_batch=16))
    'experts: ep 8 x etp 1 x edp 2 over the 16 GPUs of a stage (folded over the attention TP), alltoall dispatch'
    """
    if not m.is_moe:
        return None
    width = layout.tp * layout.cp * layout.dp
    how = "folded over the attention TP" if layout.folded else "split like the attention TP"
    overlap = f", {layout.moe_overlap} A2A overlap" if layout.moe_overlap != "none" else ""
    return (
        f"experts: ep {layout.ep} x etp {layout.expert_tp} x edp {layout.expert_dp} over the {width} GPUs of a "
        f"stage ({how}), {layout.moe_dispatcher} dispatch{overlap}"
    )


def model_lines(m: ModelSpec, layout: ParallelLayout) -> list[Text]:
    """The model's size, and its experts' grid when it has experts."""
    experts = experts_text(m, layout)
    return [params_line(m)] + ([Text(experts)] if experts else [])
