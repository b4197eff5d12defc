"""Reading user files (cluster specs, model configs) with one-sentence errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    """Parse a ``.json`` file as JSON and anything else as YAML; it must hold a mapping.

    ``what`` names the file in messages, e.g. "cluster file".
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror}.") from None
    kind = "JSON" if Path(path).suffix == ".json" else "YAML"
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{what} {path} is not valid {kind}: {str(exc).splitlines()[0]}; fix the syntax.") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path} must hold a mapping of keys to values.")
    return data
