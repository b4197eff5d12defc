"""Failure traces: a log of failures that ``ntp simulate --trace`` replays through every strategy
instead of random draws, and ``--trace-out`` writes from any simulation, in one CSV format.

Format: plain comma-separated text, UTF-8, no quoting, numbers in the digits 0-9, lines ending in
LF, CRLF or CR. Lines starting with ``#`` and blank lines are skipped. The first other line
is the header, naming the columns in any order:

=========  ========  ===============================================================================
column     required  meaning
=========  ========  ===============================================================================
time_h     yes       hours from the job's start, in order; negative: failed before it, still in repair
unit       yes       ``gpu:G`` (a job GPU, 0 .. GPUs - 1), ``host:H`` (a host, numbered as the
                     cluster places the job: ``Cluster.node_of``; it takes its job GPUs) or
                     ``domain:D`` (an NVLink domain, 0 .. domains - 1: its job GPUs and idle ones)
cause      yes       a failure class of the simulator (``hardware``, ``software``) or one of
                     Llama 3's categories, mapped onto them (``LLAMA3_CAUSES``)
repair_h   no        hours until the unit is back; empty or no column: drawn, with the seed, from
                     the cause's repair law (hardware 3-5 days, software 3 hours by default)
=========  ========  ===============================================================================

A trace is one run: the unit, not the cause, says what a failure takes down. Each line is checked
as it is read and the first bad one is refused in one sentence naming it; a file over
``MAX_TRACE_BYTES`` is refused before it is read and reading stops past ``MAX_TRACE_ROWS`` failures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ntp_planner.failures.events import Events, draw_events
from ntp_planner.failures.sim_config import MAX_EVENTS_PER_TRIAL, MAX_HOURS, FailureClass, SimConfig
from topologies.cluster import Cluster
from topologies.errors import InputError
from topologies.files import read_text

COLUMNS = ("time_h", "unit", "cause", "repair_h")
REQUIRED = COLUMNS[:3]
UNIT_KINDS = ("gpu", "host", "domain")  # in the order of sampling.BLASTS: one GPU, a host, a domain
# A replay is one trial, and its cost is the distinct failure states it re-plans: 5,000 failures
# over a year on 16,384 GPUs replay in 3 s, 20,000 (some 220 GPUs down at once) in 72 s on 2 shared
# cores (the synthetic draw of llama3_trace at 20,000 failures, 365 days). A year of 100,000 GPUs
# at Llama 3's rate is 17,000.
MAX_TRACE_ROWS = 4 * MAX_EVENTS_PER_TRIAL
MAX_LINE_CHARS = 200  # "-8760.000000000001,domain:1000000,host-maintenance,8760.0" is 58
MAX_TRACE_BYTES = MAX_TRACE_ROWS * 100 + 2**20  # rows of --trace-out's ~60 characters, with room, and comments
# Llama 3's categories of unexpected interruptions (arXiv 2407.21783, Table 5; shares in
# /work/shared/reference/failures.md), mapped onto the simulator's classes: GPU, network, NIC and
# unplanned host maintenance are hardware (76.4%; the paper says about 78% confirmed or suspected),
# software bugs, NCCL watchdog timeouts and the rest software.
LLAMA3_CAUSES = {
    "faulty-gpu": "hardware",
    "hbm3": "hardware",
    "sram": "hardware",
    "gsp": "hardware",
    "sdc": "hardware",
    "thermal": "hardware",
    "network": "hardware",
    "host-maintenance": "hardware",
    "nic": "hardware",
    "software-bug": "software",
    "nccl-watchdog": "software",
    "other": "software",
}
HEADER_COMMENT = (
    "# failure trace (ntp simulate --trace): time_h = hours from the job's start (negative: still in repair at it),\n"
    "# unit = gpu:G | host:H | domain:D, cause = a failure class, repair_h = hours until the unit is back\n"
)


@dataclass(frozen=True)
class Placement:
    """How a trace's unit ids map onto the plan's job GPUs (``Events.gpu``, ``Events.blast``)."""

    num_gpus: int  # job GPUs
    used: int  # job GPUs per NVLink domain (the last may hold fewer)
    domains: int  # NVLink domains the job uses
    host_first: dict[int, int]  # host id -> its first job GPU, for hosts holding any
    gpu_host: np.ndarray  # job GPU -> host id

    @classmethod
    def of(cls, cluster: Cluster) -> Placement:
        """Hosts as ``Cluster.node_of`` numbers them: idle GPUs of a partly used domain keep their
        places, so a host of idle GPUs only holds no job GPU. Example: 128 GPUs using 64 of each
        72-GPU domain, 4 GPUs a host: hosts 16 and 17 hold domain 0's 8 idle GPUs, GPU 64 is on host 18.

        >>> from topologies.cluster_catalogue import CLUSTERS
        >>> p = Placement.of(Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128, gpus_per_domain=64))
        >>> p.domains, sorted(p.host_first)[14:18], p.host_first[18], p.gpu_host[64].item()
        (2, [14, 15, 18, 19], 64, 18)
        """
        g = np.arange(cluster.num_gpus)
        position = g + g // cluster.used_per_domain * (cluster.spec.domain_size - cluster.used_per_domain)
        host = position // cluster.spec.gpus_per_node
        hosts, first = np.unique(host, return_index=True)
        host_first = dict(zip(hosts.tolist(), first.tolist(), strict=True))
        return cls(cluster.num_gpus, cluster.used_per_domain, cluster.num_domains, host_first, host)

    def unit(self, text: str, where: str) -> tuple[int, int]:
        """(a job GPU of the unit, its blast index) of ``gpu:G``, ``host:H`` or ``domain:D``."""
        kind, _, number = text.partition(":")
        if kind not in UNIT_KINDS or not (number.isascii() and number.isdigit()):
            raise InputError(f"{where}: unit {text!r} must be gpu:G, host:H or domain:D with a whole number")
        k = int(number)  # at most MAX_LINE_CHARS digits: past every range below, refused as not in the plan
        if kind == "gpu" and k < self.num_gpus:
            return k, 0
        if kind == "host" and k in self.host_first:
            return self.host_first[k], 1
        if kind == "domain" and k < self.domains:
            return k * self.used, 2
        ranges = {
            "gpu": f"GPUs 0..{self.num_gpus - 1}",
            "host": f"hosts 0..{max(self.host_first)}",
            "domain": f"domains 0..{self.domains - 1}",
        }
        idle = " (that host holds only idle GPUs)" if kind == "host" and k <= max(self.host_first) else ""
        raise InputError(f"{where}: {text} is not in the plan, whose job has {ranges[kind]}{idle}")

    def name(self, gpu: int, blast: int) -> str:
        """The unit id of a failure of ``gpu`` with blast index ``blast`` (``unit``'s inverse up to
        which GPU of a host or domain stands for it)."""
        if blast == 0:
            return f"gpu:{gpu}"
        return f"host:{int(self.gpu_host[gpu])}" if blast == 1 else f"domain:{gpu // self.used}"


def read_trace(path: Path, placement: Placement, cfg: SimConfig, rng: np.random.Generator) -> Events:
    """The failures of the trace file at ``path`` as one trial's events (see ``parse_trace``)."""
    text = read_text(Path(path), "trace", max_bytes=MAX_TRACE_BYTES)
    return parse_trace(iter(_LINE_BREAK.split(text)), placement, cfg, rng, f"trace {path}")


# Lines end at \n, \r\n or \r only, as editors number them (str.splitlines also breaks at \f, \x1c-\x1e,
# \x85, \u2028 and \u2029, which shifted the line numbers of every message after one)
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def parse_trace(
    lines: Iterable[str], placement: Placement, cfg: SimConfig, rng: np.random.Generator, name: str = "trace"
) -> Events:
    """One trial's events from the lines of a trace, checked line by line; missing repairs are
    drawn from ``rng`` in line order. Stops reading past ``MAX_TRACE_ROWS`` failures."""
    horizon_h = cfg.days * 24
    causes = {c.name: i for i, c in enumerate(cfg.classes)}
    rows: list[tuple[float, int, int, int, float]] = []  # time, gpu, blast, class, repair (nan: draw)
    columns = None
    last = -math.inf
    for number, line in _numbered(lines, name):
        where = f"{name} line {number}"
        if columns is None:
            columns = _header(line, where)
            continue
        if len(rows) == MAX_TRACE_ROWS:
            raise InputError(
                f"{where}: the trace holds more than {MAX_TRACE_ROWS:,} failures, more than one run of "
                "the simulator can replay in minutes; split it or keep the part you need"
            )
        row = _row(line, columns, where, placement, causes, horizon_h)
        if row[0] < last:
            raise InputError(f"{where}: time {row[0]:g} h comes before the previous line's {last:g} h; sort the trace")
        last = row[0]
        rows.append(row)
    if columns is None:
        raise InputError(f"{name} has no header line; the first line must name the columns {','.join(COLUMNS)}")
    return _events(rows, cfg.classes, rng)


def _numbered(lines: Iterable[str], name: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the lines that are neither blank nor comments, each checked for
    length; a comment may be longer (--trace-out's names the replayed file, whose path may be long)."""
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if len(line) > MAX_LINE_CHARS:
            raise InputError(
                f"{name} line {number} has {len(line):,} characters; a trace line needs at most {MAX_LINE_CHARS}"
            )
        yield number, text


def _header(line: str, where: str) -> dict[str, int]:
    names = [c.strip() for c in line.split(",")]
    unknown = [c for c in names if c not in COLUMNS]
    missing = [c for c in REQUIRED if c not in names]
    repeated = sorted({c for c in names if names.count(c) > 1})
    if unknown or missing or repeated:
        what = f"{repeated} twice"
        what = f"missing columns {missing}" if missing else what
        what = f"unknown columns {unknown}" if unknown else what
        what = "an empty column name (a trailing comma?)" if "" in names else what
        raise InputError(f"{where}: the header has {what}; it must name {','.join(REQUIRED)} and optionally repair_h")
    return {c: i for i, c in enumerate(names)}


def _row(line, columns, where, placement: Placement, causes, horizon_h) -> tuple[float, int, int, int, float]:
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(columns):
        raise InputError(f"{where} has {len(cells)} fields; the header names {len(columns)}")
    time_h = _number(cells[columns["time_h"]], "time_h", where)
    if not -MAX_HOURS <= time_h < horizon_h:
        raise InputError(
            f"{where}: time {time_h:g} h is outside the run: give hours from -{MAX_HOURS} (a repair still under way "
            f"at the start) to below the simulated {horizon_h:g} h (--days {horizon_h / 24:g})"
        )
    gpu, blast = placement.unit(cells[columns["unit"]], where)
    cause = cells[columns["cause"]]
    cls = causes.get(cause, causes.get(LLAMA3_CAUSES.get(cause, ""), -1))
    if cls < 0:
        known = sorted(set(causes) | {k for k, v in LLAMA3_CAUSES.items() if v in causes})
        raise InputError(f"{where}: cause {cause!r} is not a failure class here; give one of {', '.join(known)}")
    repair = cells[columns["repair_h"]] if "repair_h" in columns else ""
    repair_h = math.nan if repair == "" else _number(repair, "repair_h", where)
    if not (math.isnan(repair_h) or 0 <= repair_h <= MAX_HOURS):
        raise InputError(f"{where}: repair_h {repair_h:g} must be 0 to {MAX_HOURS} hours (a year), or empty to draw")
    return time_h, gpu, blast, cls, repair_h


# A decimal number in ASCII: float() also reads "１" (full-width), "1_0" and other digits of Unicode
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _number(text: str, column: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{where}: {column} {text!r} is not a number") from None
    if math.isfinite(value) and not _DECIMAL.fullmatch(text):
        raise InputError(f"{where}: {column} {text!r} is not a decimal number in the digits 0-9, e.g. 12.5")
    if not math.isfinite(value):
        raise InputError(f"{where}: {column} {text!r} is not a finite number")
    return value


def _events(rows, classes: tuple[FailureClass, ...], rng: np.random.Generator) -> Events:
    """One trial's events; repairs left out are drawn uniformly from their class's range, and
    failures repaired before the job's start are dropped (they change nothing)."""
    t, gpu, blast, cls, repair = np.array(rows, dtype=float).reshape(-1, 5).T
    gpu, blast, cls = gpu.astype(np.int64), blast.astype(np.int64), cls.astype(np.int64)
    draw = np.isnan(repair)
    lo = np.array([c.repair_min_h for c in classes])[cls[draw]]
    hi = np.array([c.repair_max_h for c in classes])[cls[draw]]
    repair[draw] = rng.uniform(lo, hi)
    end = t + repair
    keep = end > 0
    ev = Events(np.zeros(t.size, dtype=np.int64), t, end, gpu, blast, cls)
    return ev.take(keep)


def format_trace(ev: Events, placement: Placement, classes: tuple[FailureClass, ...], note: str = "") -> str:
    """``ev`` (one trial's) as trace text, in time order, with every number written exactly
    (shortest round-trip decimal), so reading it back gives the same times and repairs."""
    order = np.argsort(ev.start_h, kind="stable")
    note = _LINE_BREAK.sub(" ", note)  # one comment line, whatever the replayed file's name holds
    lines = [HEADER_COMMENT + (f"# {note}\n" if note else "") + ",".join(COLUMNS)]
    for i in order:
        unit = placement.name(int(ev.gpu[i]), int(ev.blast[i]))
        start, end = float(ev.start_h[i]), float(ev.end_h[i])
        lines.append(f"{start!r},{unit},{classes[int(ev.cause[i])].name},{end - start!r}")
    return "\n".join(lines) + "\n"


EventSource = Callable[[SimConfig, int, int, np.random.Generator], Events]


def replay(ev: Events) -> EventSource:
    """An event source for ``simulator.simulate`` that gives ``ev`` as its only trial."""

    def source(cfg: SimConfig, num_gpus: int, gpus_per_host: int, rng: np.random.Generator) -> Events:
        if cfg.trials != 1:
            raise ValueError(f"a trace replays one trial, not {cfg.trials}")
        return ev

    return source


class Recorder:
    """An event source that passes on another's events and keeps those of trial ``trial`` (the
    simulator asks for batches of trials in order)."""

    def __init__(self, trial: int, source: EventSource = draw_events):
        self.trial, self.source, self.first = trial, source, 0
        self.kept: Events | None = None

    def __call__(self, cfg: SimConfig, num_gpus: int, gpus_per_host: int, rng: np.random.Generator) -> Events:
        ev = self.source(cfg, num_gpus, gpus_per_host, rng)
        if self.first <= self.trial < self.first + cfg.trials:
            self.kept = ev.take(ev.trial == self.trial - self.first)
        self.first += cfg.trials
        return ev
