"""Live recovery's membership protocol: every store key a live run uses, and the few operations
on them that must be atomic. One protocol for both hosts of the store.

The store is any ``torch.distributed.Store`` that outlives the processes it coordinates:

* one host (``ntp validate --fail``): a ``TCPStore`` hosted by the launcher, which also spawned
  the processes (``launch``);
* torchrun (``torchrun ... ntp validate --fail``): the ``TCPStore`` torchrun's agents share
  with their workers (``MASTER_ADDR:MASTER_PORT``, hosted by the agent of rendezvous rank 0),
  reached through a ``PrefixStore`` per run (``torchrun``). torchft's lighthouse was the other
  candidate: it decides quorums of whole data-parallel replicas around a fixed model-parallel
  layout, while a replica here changes its TP degree, and it would be one more server to run;
  the agent store is already there and offers the compare-and-set the decisions below need.

Membership moves in generations. ``layout/<n>`` holds generation n (``worker.Generation``): the
layout, where its state comes from, the step it starts at. A process of generation n leaves it
(``left``) when a collective fails or the generation is aborted; the coordinator publishes n + 1.
Decisions that every process must read alike are written once with ``compare_set`` from the
empty value: whether step k runs (``go``: "go" by the first rank to reach it, "stop" by the
coordinator stopping at that boundary), whether it commits (``decision``: "commit" by the last
vote, "abort" by a rank that sees the generation aborted or waits too long). The first value
written wins, so concurrent writers decide once.

Keys (n: generation, k: step, r: rank in the generation, p: process number)::

    layout/<n>                 the pickled Generation
    g<n>/abort                 the coordinator aborted generation n
    g<n>/go/<k>                "go" or "stop": whether step k runs in generation n
    g<n>/votes/<k>             votes counted for step k; g<n>/share/<k>/<r> rank r's loss share
    g<n>/decision/<k>          "commit" or "abort"
    g<n>/left, g<n>/left/<p>   how many left, and why and when process p left
    g<n>/times/<r>             rank r's regroup and state-move seconds (its state is in place)
    g<n>/saved/<k>             ranks that saved the checkpoint of step k
    g<n>/pg/                   the prefix of generation n's process group
    log/count, log/<i>         committed steps, in commit order
    fail/<p>, fired/<p>/<k>    an injected fault fired (when, how), once per process and step
    ready/<p>, error/<p>       process p is up; the one line it said before it died
    result, done               the final gather's holdings (pickled); the generation that wrote them
    host/<p>/...               the host of process p (``hosts.StoreHosts``): beat, exit, progress, kill
    join/count, join/<i>       processes that asked to join (a repair), and the answer
"""

from __future__ import annotations

import json
import pickle
import time

POLL_S = 0.002  # store polling interval while waiting for a decision


def publish(store, gen) -> None:
    """Publish generation ``gen`` (a ``worker.Generation``): every process waits for it."""
    store.set(f"layout/{gen.number}", pickle.dumps(gen))


def await_generation(store, n: int, poll_s: float = 0.01):
    """Generation ``n``, once it is published (the run's end is a Generation with no layout)."""
    key = f"layout/{n}"
    while not store.check([key]):
        time.sleep(poll_s)
    return pickle.loads(store.get(key))


def may_run(store, n: int, step: int) -> bool:
    """Whether ``step`` runs in generation ``n``: the first rank to reach it says "go", unless the
    coordinator said "stop" first (``stop_at``)."""
    return store.compare_set(f"g{n}/go/{step}", "", "go") == b"go"


def stop_at(store, n: int, step: int) -> bool:
    """Stop generation ``n`` before ``step``; False when a rank entered the step already."""
    return store.compare_set(f"g{n}/go/{step}", "", "stop") == b"stop"


def abort(store, n: int) -> None:
    store.set(f"g{n}/abort", "1")


def aborted(store, n: int) -> bool:
    return store.check([f"g{n}/abort"])


def vote(store, n: int, step: int, rank: int, world: int, share: float, record: dict, timeout_s: float) -> str:
    """Rank ``rank``'s vote for committing ``step``; returns the decision every rank reads.

    The vote that completes the count writes "commit" and logs ``record`` (the step, with the
    summed loss); a rank that sees the generation aborted, or waits longer than ``timeout_s``,
    writes "abort". Whichever is written first is the decision. Example, world 2: rank 0 votes
    (count 1) and waits; rank 1 votes (count 2), writes "commit" and logs the step; rank 0 reads
    "commit". Had the coordinator aborted between the two votes, rank 0 could have written
    "abort" first: rank 1's compare-and-set then returns "abort", and neither logs nor steps.
    """
    prefix = f"g{n}/share/{step}/"
    store.set(f"{prefix}{rank}", repr(float(share)))
    decision = f"g{n}/decision/{step}"
    if store.add(f"g{n}/votes/{step}", 1) == world:
        loss = sum(float(v) for v in store.multi_get([f"{prefix}{r}" for r in range(world)]))
        if store.compare_set(decision, "", "commit") == b"commit":
            append_log(store, record | {"loss": loss, "t": time.time()})
    deadline = time.monotonic() + timeout_s
    while not store.check([decision]):
        if aborted(store, n) or time.monotonic() > deadline:
            return store.compare_set(decision, "", "abort").decode()
        time.sleep(POLL_S)
    return store.get(decision).decode()


def append_log(store, record: dict) -> None:
    """Append a committed step to the log (its index from the counter: no two share one)."""
    store.set(f"log/{store.add('log/count', 1) - 1}", json.dumps(record))


def read_log(store, start: int) -> list[dict]:
    """The committed steps from index ``start`` on, up to the first counted but not yet written."""
    out = []
    count = int(store.add("log/count", 0))
    for i in range(start, count):
        key = f"log/{i}"
        if not store.check([key]):
            break
        out.append(json.loads(store.get(key)))
    return out


def leave(store, n: int, proc: int, why: str, step: int) -> None:
    """Process ``proc`` leaves generation ``n`` (its state is its last committed step's)."""
    store.set(f"g{n}/left/{proc}", json.dumps({"why": why[:300], "t": time.time(), "step": step}))
    store.add(f"g{n}/left", 1)


def left_count(store, n: int) -> int:
    return int(store.add(f"g{n}/left", 0))


def has_left(store, n: int, proc: int) -> bool:
    return store.check([f"g{n}/left/{proc}"])


def left_reasons(store, n: int, procs) -> dict[int, dict]:
    """Why and when each of ``procs`` that left generation ``n`` left."""
    keys = {p: f"g{n}/left/{p}" for p in procs}
    return {p: json.loads(store.get(k)) for p, k in keys.items() if store.check([k])}


def report_times(store, n: int, rank: int, times: dict) -> None:
    """Rank ``rank`` of generation ``n`` has its state in place; ``times`` says how long it took."""
    store.set(f"g{n}/times/{rank}", json.dumps(times))


def in_place(store, n: int, ranks) -> bool:
    """Whether every one of ``ranks`` of generation ``n`` has its state in place."""
    return all(store.check([f"g{n}/times/{r}"]) for r in ranks)


def times(store, n: int, ranks) -> list[dict]:
    """The times reported by those of ``ranks`` that have their state in place."""
    keys = [f"g{n}/times/{r}" for r in ranks]
    return [json.loads(store.get(k)) for k in keys if store.check([k])]


def saved(store, n: int, step: int) -> int:
    """Count one more rank that saved the checkpoint of ``step``; the count so far."""
    return int(store.add(f"g{n}/saved/{step}", 1))


def group_prefix(n: int) -> str:
    return f"g{n}/pg/"


def fire(store, proc: int, step: int, how: str) -> bool:
    """Record that ``proc``'s fault of ``step`` fires now; False if it fired before (each fires once:
    a step redone after a rollback does not fail again). Only ``proc`` itself, or the coordinator
    for a process that runs nothing, fires its faults: no two writers race."""
    if fired(store, proc, step):
        return False
    store.set(f"fail/{proc}", json.dumps({"t": time.time(), "how": how, "step": step}))
    store.set(f"fired/{proc}/{step}", "1")
    return True


def fired(store, proc: int, step: int) -> bool:
    return store.check([f"fired/{proc}/{step}"])


def last_fault(store, proc: int) -> dict | None:
    """When and how ``proc``'s latest injected fault fired (None: never)."""
    return json.loads(store.get(f"fail/{proc}")) if store.check([f"fail/{proc}"]) else None


def ready(store, proc: int) -> None:
    store.set(f"ready/{proc}", str(time.time()))


def is_ready(store, proc: int) -> bool:
    return store.check([f"ready/{proc}"])


def unready(store, proc: int) -> None:
    store.delete_key(f"ready/{proc}")


def say_error(store, proc: int, line: str) -> None:
    """What process ``proc`` said before dying of its own error (read by the coordinator)."""
    store.set(f"error/{proc}", line)


def error_of(store, proc: int) -> str | None:
    return store.get(f"error/{proc}").decode() if store.check([f"error/{proc}"]) else None


PIECE_BYTES = 4 << 20  # a TCPStore drops a connection that sets one value of ~8 MiB or more (torch 2.x)


def finish(store, n: int, holders: list) -> None:
    """The final gather's holdings, pickled in pieces of at most ``PIECE_BYTES`` (a run of many
    whole-weight ranks holds more than one store value takes); ``done`` last, so that whoever
    sees it finds them."""
    blob = pickle.dumps({"holders": holders, "generation": n})
    pieces = [blob[i : i + PIECE_BYTES] for i in range(0, len(blob), PIECE_BYTES)] or [b""]
    for i, piece in enumerate(pieces):
        store.set(f"result/{i}", piece)
    store.set("result", str(len(pieces)))
    store.set("done", str(n))


def is_done(store) -> bool:
    return store.check(["done"])


def result(store) -> dict:
    pieces = int(store.get("result"))
    return pickle.loads(b"".join(store.get(f"result/{i}") for i in range(pieces)))
