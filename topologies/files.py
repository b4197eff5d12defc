"""Reading user files (cluster specs, model configs, plans) with one-sentence errors.

A file may be anything: a folder, a pipe that never ends, gigabytes, Latin-1 bytes, JSON nested
200,000 deep, or YAML whose aliases expand a few lines into billions of values. Each is refused
with an ``InputError`` naming the file before it can take the process down or hang it.
"""

from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from topologies.bounds import show
from topologies.errors import InputError


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader reading floats as YAML 1.2 does: ``4.5e11`` and ``1e-6`` are numbers
    (YAML 1.1 wants a dot and a signed exponent, so PyYAML reads them as strings), which lets the
    models that read these files refuse a quoted number instead of converting it."""


class _DuplicateKey(Exception):
    """A mapping names a key twice: JSON and YAML parsers keep the last silently, so that a hand
    edit above an old line, or a pasted block, changes nothing and nobody is told."""


def _unique_json(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _DuplicateKey(next(k for i, k in enumerate(keys) if k in keys[:i]))
    return dict(pairs)


def _compose_unique(loader: _Loader, anchor):
    """PyYAML's ``compose_mapping_node``, refusing a key written twice in one mapping (a merge
    ``<<`` may repeat keys: that is what it is for)."""
    node = yaml.composer.Composer.compose_mapping_node(loader, anchor)
    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        if (key.tag, key.value) in seen:
            raise _DuplicateKey(key.value)
        seen.add((key.tag, key.value))
    return node


_Loader.compose_mapping_node = _compose_unique
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)

MAX_FILE_BYTES = 16 * 2**20  # a cluster or model file is a few kilobytes; plans pass their own limit
MAX_DEPTH = 32  # a cluster file nests 2 levels, a HuggingFace config 3, a plan 6


STDIN = "-"  # the path that means standard input (``ntp estimate -``, ``--replan -``)


def read_text(path: Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The text of a regular file of at most ``max_bytes``, decoded as UTF-8 (a BOM is dropped);
    ``-`` reads standard input, to its end, under the same limit."""
    path = Path(path)
    if str(path) == STDIN:
        return _decode(_read_stdin(what, max_bytes), what, path)
    try:
        info = path.stat()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}.") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"cannot read {what} {path}: it is a folder; give the path of a file.")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"cannot read {what} {path}: it is not a regular file (a pipe or device); give a file.")
    if info.st_size > max_bytes:
        raise InputError(
            f"{what} {path} holds {show(info.st_size)} bytes, more than the {show(max_bytes)} a {what} can need; "
            "check that it is the right file."
        )
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)  # the file may have grown since stat
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}.") from None
    if len(data) > max_bytes:
        raise InputError(f"{what} {path} holds more than the {show(max_bytes)} bytes a {what} can need.")
    return _decode(data, what, path)


def _read_stdin(what: str, max_bytes: int) -> bytes:
    if sys.stdin is None or sys.stdin.isatty():
        raise InputError(
            f"cannot read {what} from - (standard input): it is a terminal; pipe the file in or give its path."
        )
    stream = getattr(sys.stdin, "buffer", None)
    try:
        data = stream.read(max_bytes + 1) if stream is not None else sys.stdin.read(max_bytes + 1).encode()
    except OSError as exc:
        raise InputError(f"cannot read {what} from standard input: {exc.strerror or exc}.") from None
    if len(data) > max_bytes:
        raise InputError(f"{what} on standard input holds more than the {show(max_bytes)} bytes a {what} can need.")
    if not data:
        raise InputError(
            f"{what} on standard input is empty; pipe the file in, e.g. `ntp plan ... -o - | ntp explain -`."
        )
    return data


def _decode(data: bytes, what: str, path: Path) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as UTF-8."
        ) from None


def parse(text: str, path: Path, what: str, kind: str) -> Any:
    """``text`` parsed as ``kind`` ("JSON" or "YAML"), checked to be a tree of bounded depth."""
    try:
        if kind == "JSON":
            data = json.loads(text, object_pairs_hook=_unique_json)
        else:
            data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except _DuplicateKey as exc:
        raise InputError(f"{what} {path} gives the key {exc.args[0]!r} twice in one mapping; keep one.") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"{what} {path} is not valid {kind}: {str(exc).splitlines()[0]}; fix the syntax.") from None
    except RecursionError:
        raise InputError(f"{what} {path} nests deeper than {MAX_DEPTH} levels; a {what} needs a few.") from None
    except ValueError as exc:  # an integer of more than 4,300 digits, a YAML date 2024-13-45
        if "integer string conversion" in str(exc):  # Python's advice (set_int_max_str_digits) is not the user's
            raise InputError(
                f"{what} {path} holds a number of more than {sys.get_int_max_str_digits():,} digits; no field "
                "takes one that long, fix the value."
            ) from None
        raise InputError(f"{what} {path} is not valid {kind}: {str(exc).splitlines()[0]}; fix the value.") from None
    check_tree(data, f"{what} {path}")
    return data


def check_tree(data: Any, where: str) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` and containers reached twice (YAML aliases, whose
    expansion can grow exponentially, and self-references), walking without recursion."""
    seen: set[int] = set()
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if id(node) in seen:
            raise InputError(f"{where} reuses a block through a YAML alias (*name); write the values out.")
        seen.add(id(node))
        if depth > MAX_DEPTH:
            raise InputError(f"{where} nests deeper than {MAX_DEPTH} levels; a file of this kind needs a few.")
        stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))


def read_mapping(path: Path, what: str, max_bytes: int = MAX_FILE_BYTES, kind: str | None = None) -> dict[str, Any]:
    """Parse a file as ``kind``, by default JSON for ``.json`` and YAML otherwise; it must hold a
    mapping. ``what`` names the file in messages, e.g. "cluster file"."""
    kind = kind or ("JSON" if Path(path).suffix == ".json" else "YAML")
    data = parse(read_text(path, what, max_bytes), path, what, kind)
    if not isinstance(data, dict):
        raise InputError(f"{what} {path} must hold a mapping of keys to values.")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise InputError(f"{what} {path} has key {bad[0]!r}, which is not text; keys are field names.")
    return data
