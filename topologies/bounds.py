"""Bounds on input numbers, each with its unit and the reason for it.

A bound is wide: it refuses typos, wrong units and values no machine can hold (a 10**30-sequence
batch, a bandwidth of 1e-300 bytes/s), never a real design. Each model keeps a table of its
bounds beside its fields and checks them with ``bounds_validator``, so a refusal reads

    global_batch: must lie in 1..10,000,000 sequences, not 1e+30: <why>

(pydantic puts the field name in front). Non-finite floats are refused earlier, by the models'
``allow_inf_nan=False``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from pydantic import ValidationInfo, field_validator

from topologies.errors import InputError


def show(value: float) -> str:
    """A number as a message prints it: exact when short, 3 digits when long.

    >>> show(10_000_000), show(10**30), show(2.5e-7), show(1e400**0), show(10**5000)
    ('10,000,000', '1e+30', '2.5e-07', '1', 'about 1e+5000')
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) < 10**8:
            return f"{value:,}"
        if value.bit_length() > 1000:  # beyond a float; str() of it may be refused outright
            return f"about 1e+{int(value.bit_length() * 0.30103)}"
        return f"{value:.3g}"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3g}" if value != int(value) or abs(value) >= 1e8 else f"{value:,.0f}"


class Bound(NamedTuple):
    """Closed range ``lo..hi`` of one field, in ``unit``; ``why`` justifies it in one clause."""

    lo: float
    hi: float
    unit: str
    why: str

    def check(self, value: float | None) -> float | None:
        """``value`` unchanged if it lies in range (None passes), else InputError."""
        if value is None or self.lo <= value <= self.hi:
            return value
        raise InputError(f"must lie in {show(self.lo)}..{show(self.hi)} {self.unit}, not {show(value)}: {self.why}")


def bounds_validator(table: Mapping[str, Bound]):
    """A pydantic field validator checking each field named in ``table`` against its bound.

    Use it in a model's body: ``_bounds = bounds_validator(_BOUNDS)``.
    """

    def check(cls, value, info: ValidationInfo):
        return table[info.field_name].check(value)

    return field_validator(*table)(check)
