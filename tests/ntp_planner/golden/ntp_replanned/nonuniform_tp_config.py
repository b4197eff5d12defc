"""Megatron-LM's NonuniformTPConfig for this re-plan, from nonuniform_tp.json beside this file.

Megatron keys non_active_ranks_per_dp by (dp, cp, pp) tuples; JSON writes them "dp,cp,pp".
Needs Megatron-LM with megatron/core/distributed/nonuniform_tp.py (its dev branch, 2026).
"""

import json
from pathlib import Path


def settings() -> dict:
    """The config's fields, keys as Megatron's tuples."""
    data = json.loads(Path(__file__).with_name("nonuniform_tp.json").read_text())
    data["non_active_ranks_per_dp"] = {
        tuple(int(i) for i in key.split(",")): ranks for key, ranks in data["non_active_ranks_per_dp"].items()
    }
    return data


def ntp_config():
    from megatron.core.distributed.nonuniform_tp import NonuniformTPConfig

    return NonuniformTPConfig(**settings())
