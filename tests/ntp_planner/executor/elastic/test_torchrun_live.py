"""Live recovery under torchrun across rendezvous nodes on this host: each node is a torchrun agent
of its own (``--nnodes N``, c10d rendezvous on a free port, hosted by node 0's agent as the
endpoint's host would be), started in a session of its own, as separate hosts would be. A node is
lost for real (``--fail P@S:host``: SIGKILL of its agent's process group and of every worker's
under it), a single process is killed, a repair joins the run later (``ntp validate --join``);
the survivors re-plan with NTP and the final state equals one process fed the samples the run
committed (float64).

torchrun's surviving agents wait up to five minutes in their exit barrier for the lost agent;
the report is out before, so each test reads it and then kills what is left of every agent."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.elastic.faults import host_tree  # noqa: E402

BIN = Path(sys.executable).parent
DEADLINE_S = 100.0  # a case takes 30-45 s on two cores


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """megatron-1.7b at TP2 x DP4 on 8 H100s; shrunk to 4 processes it runs TP2 x DP2 (replica 0
    on processes 0-1, replica 1 on 2-3), and a replica losing a process still fits at TP1."""
    from typer.testing import CliRunner

    from ntp_planner.cli import app

    out = tmp_path_factory.mktemp("torchrun") / "p.json"
    # ZeRO-0: a lost process's optimizer rows live on in the other replica, so recovery is from
    # memory (at ZeRO >= 1 its shard has no other holder: test_live_sharded)
    args = [
        "estimate",
        "-m",
        "megatron-1.7b",
        "-c",
        "dgx-h100",
        "--seq-len",
        "2048",
        "-n",
        "8",
        "--tp",
        "2",
        "--zero",
        "0",
    ]
    assert CliRunner().invoke(app, [*args, "--global-batch", "16", "-o", str(out)]).exit_code == 0
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_tree(pid: int) -> None:
    for p in reversed(host_tree(pid)):
        try:
            os.killpg(os.getpgid(p), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def live_run(tmp: Path, plan: Path, nprocs: list[int], args: list[str], joiner: bool = False, node: int = 0) -> dict:
    """Agents with ``nprocs`` workers each (node i is rendezvous rank i); optionally a joiner once
    rank 0 prints the address. Returns the JSON report of node ``node``'s first worker, with the
    joiner's stderr under "joiner"."""
    for tool in ("torchrun", "ntp"):
        if not (BIN / tool).exists():
            pytest.skip(f"{tool} is not installed next to this Python")
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    port = free_port()
    rdzv = ["--nnodes", str(len(nprocs)), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}"]
    cmd = [str(BIN / "ntp"), "validate", str(plan), "--dtype", "float64", "--json", "--timeout", "20", *args]
    procs = []
    try:
        for i, k in enumerate(nprocs):
            # rendezvous ranks follow the agents' addresses, sorted (then their pids, which wrap):
            # node i takes loopback address 127.0.0.(i + 1), so that it is rank i
            local = ["--local-addr", f"127.0.0.{i + 1}", "--nproc-per-node", str(k)]
            argv = [str(BIN / "torchrun"), *rdzv, "--rdzv-id", "t", *local, *cmd]
            out, err = open(tmp / f"n{i}.out", "w"), open(tmp / f"n{i}.err", "w")  # noqa: SIM115
            procs.append(subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True))
            if i == 0:  # node 0's agent must host the rendezvous store: the others come once it listens
                _wait_for(lambda: _listening(port), time.monotonic() + 30, tmp)
        deadline = time.monotonic() + DEADLINE_S
        if joiner:
            address = _wait_for(lambda: _join_address(tmp / "n0.err"), deadline, tmp)
            argv = [str(BIN / "ntp"), "validate", str(plan), "--join", address]
            err = open(tmp / "joiner.err", "w")  # noqa: SIM115
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True))
        report = _wait_for(lambda: _json(tmp / f"n{node}.out"), deadline, tmp)
        if joiner:
            procs[-1].wait(timeout=max(1.0, deadline - time.monotonic()))
            report["joiner"] = (tmp / "joiner.err").read_text()
        return report
    finally:
        for p in procs:
            kill_tree(p.pid)
            p.wait(timeout=10)


def _wait_for(get, deadline: float, tmp: Path):
    while (got := get()) is None:
        if time.monotonic() > deadline:
            said = "\n".join(f"{f.name}: {f.read_text()[-800:]}" for f in sorted(tmp.glob("*.err")))
            pytest.fail(f"no report within {DEADLINE_S:g} s\n{said}")
        time.sleep(0.2)
    return got


def _listening(port: int) -> bool | None:
    with socket.socket() as s:
        return True if s.connect_ex(("127.0.0.1", port)) == 0 else None


def _join_address(err: Path) -> str | None:
    words = err.read_text().split() if err.exists() else []
    return words[words.index("--join") + 1] if "--join" in words else None


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written, or not all of it yet
        return None


def exact(report: dict, steps: int) -> None:
    assert report["passed"], report.get("failure") or report["problems"]
    assert [s["step"] for s in report["samples"]] == list(range(steps))
    assert report["max_rel_error_params"] <= 1e-9 and report["max_rel_error_loss"] <= 1e-9


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_three_agents_lose_a_whole_node_and_a_process_and_finish_exact(plan, tmp_path):
    # node 0 runs processes 0-1 (replica 0), node 1 process 2, node 2 process 3 (replica 1 spans
    # nodes 1 and 2). Step 1: node 2 is lost whole; replica 1 goes on at TP1 on process 2, which
    # fetches process 3's rows from replica 0. Step 3: process 1 (node 0) is SIGKILLed alone; its
    # shell stays up, so torchrun's agent keeps node 0's other worker: replica 0 goes on at TP1.
    report = live_run(tmp_path, plan, [2, 1, 1], ["--steps", "5", "--fail", "3@1:host", "--fail", "1@3"])
    exact(report, 5)
    host, proc = report["timeline"]
    assert (host["event"], host["step"], host["procs"], host["source"]) == ("failure", 1, [3], "memory")
    assert host["layout"].startswith("TP2 + TP1") and host["bytes_moved"] > 0
    (lost,) = host["lost_hosts"]  # named: the node, its host and agent, and why it counts as lost
    assert lost.startswith("node 2 (host ") and "lost: no heartbeat from process 3's shell" in lost
    assert (proc["step"], proc["procs"], proc["lost_hosts"]) == (3, [1], [])
    assert proc["layout"].startswith("TP1 + TP1")
    # the stream: 4 samples a step at TP2 + TP2, 3 at TP2 + TP1, 2 at TP1 + TP1
    assert [s["batch"] for s in report["samples"]] == [4, 3, 3, 2, 2]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_agents_lose_a_node_and_a_joiner_takes_it_back(plan, tmp_path):
    # node 1 (process 3 alone) is lost in step 1; a process started later joins the run through
    # the store (``--join``, the address rank 0 printed) and becomes process 3 again at the next
    # step boundary: replica 1 returns to TP2 and the newcomer pulls its rows from its peers
    report = live_run(tmp_path, plan, [3, 1], ["--steps", "5", "--fail", "3@1:host"], joiner=True)
    exact(report, 5)
    fail, fix = report["timeline"]
    assert (fail["event"], fail["procs"], fail["lost_hosts"][0][:7]) == ("failure", [3], "node 1 ")
    assert (fix["event"], fix["procs"], fix["source"]) == ("repair", [3], "memory")
    assert fix["layout"].startswith("TP2 + TP2") and fix["bytes_moved"] > 0
    assert report["samples"][-1]["batch"] == 4
    assert "joined as process 3" in report["joiner"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_losing_the_node_that_hosts_the_store_ends_the_run_in_one_sentence(plan, tmp_path):
    # node 0 (rendezvous rank 0) hosts the agent store and the coordinator: with it goes the
    # membership. Process 3's shell, on node 1, finds the store gone and says so, once, in JSON
    report = live_run(tmp_path, plan, [3, 1], ["--steps", "4", "--fail", "0@1:host"], node=1)
    assert report["passed"] is False
    assert report["failure"].startswith("process 3's shell lost the store at 127.0.0.1:")
    assert report["failure"].endswith("rank 0's node, which hosts it and the coordinator, is gone, and the run's "
                                      "membership with it; the run cannot go on")  # fmt: skip
