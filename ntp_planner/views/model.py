"""The model's size as every command shows it: total and active parameters (``ModelSpec``'s
``params_total`` / ``params_active``, the model cards' convention), one line for tables and two
keys for ``--json``."""

from __future__ import annotations

from rich.text import Text

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
