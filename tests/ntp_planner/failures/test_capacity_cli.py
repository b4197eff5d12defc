"""`ntp capacity` through the CLI: a tiny grid end to end, and bad input refused in one sentence
with exit code 2, as a JSON object too with --json."""

import json

import pytest
from typer.testing import CliRunner

from ntp_planner.cli import app

runner = CliRunner()
TINY = ["capacity", "-m", "llama3-8b", "--tokens", "1e11", "--deadline-days", "1.5", "--confidence", "0.9",
        "-c", "dgx-h100,gb200-nvl72", "--gpus", "64-128", "--spares", "0,1", "--strategies", "restart,ntp",
        "--trials", "8", "--seq-len", "4096", "--global-batch", "256"]  # fmt: skip


def test_a_tiny_grid_names_the_cheapest_of_those_meeting_the_deadline(tmp_path):
    pytest.importorskip("matplotlib")
    result = runner.invoke(app, [*TINY, "--json", "--plot", tmp_path / "plots"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert len(out["candidates"]) == 2 * 2 * 2 * 2
    meets = [c for c in out["candidates"] if c["p50_days"] is not None and c["p_deadline"] >= 0.9]
    assert out["cheapest"] == min(meets, key=lambda c: (c["cost_usd"], c["days_at_confidence"]))
    assert all(c["reason"] for c in out["candidates"] if c["verdict"] == "lost")
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["deadline_probability.png", "front.png"]
    assert out["prices"]["dgx-h100"]["usd_per_gpu_hour"] == pytest.approx(49.24 / 8)
    assert "coreweave" in out["prices"]["gb200-nvl72"]["source"].lower()
    c = out["cheapest"]
    one = [*TINY[:11], "-c", c["cluster"], "--gpus", str(c["gpus"]), *TINY[15:]]
    table = " ".join(runner.invoke(app, one).stdout.split())
    assert f"Cheapest meeting it: {c['cluster']} x {c['gpus']} + {c['spares']} spare" in table
    assert f"{c['gpu_hours'] / 1e3:,.1f}k GPU-hours ({c['paid_gpus']} GPUs paid for)" in table


@pytest.mark.parametrize(
    "change, says",
    [
        ({"-c": "dgx-h100,no-such"}, "unknown cluster 'no-such'"),
        ({"--gpus": "lots"}, "--gpus 'lots' must be a range like 4096-32768"),
        ({"--gpus": "128-64"}, "--gpus '128-64' is reversed"),
        ({"--gpus": "64-128-256"}, "must be a range"),
        ({"--tokens": "-5"}, "--tokens -5"),
        ({"--tokens": "nan"}, "--tokens nan"),
        ({"--tokens": "inf"}, "--tokens inf"),
        ({"--deadline-days": "0"}, "--deadline-days 0"),
        ({"--confidence": "1"}, "--confidence 1"),
        ({"--confidence": "0"}, "--confidence 0"),
        ({"--confidence": "1.5"}, "--confidence 1.5"),
        ({"--strategies": "restart,magic"}, "magic is not one of"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(change, says):
    args = list(TINY)
    for option, value in change.items():
        args[args.index(option) + 1] = value
    for extra in ([], ["--json"]):
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 2, result.output
        line = result.stderr.strip()
        assert line.startswith("error: ") and says in line and "\n" not in line
        if extra:
            error = json.loads(result.stdout)["error"]
            assert error["code"] == 2 and says in error["message"]
        else:
            assert result.stdout == ""


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--gpu-hour-cost", "dgx-b200=5"], "--gpu-hour-cost 'dgx-b200=5' names 'dgx-b200', which is not searched"),
        (["--gpu-hour-cost", "dgx-h100=-1"], "must be CLUSTER=USD"),
        (["--gpu-hour-cost", "dgx-h100"], "must be CLUSTER=USD"),
        (["-c", "dgx-b300"], "no default GPU-hour price for B300 (cluster dgx-b300)"),
    ],
)
def test_prices_are_checked(extra, says):
    result = runner.invoke(app, [*TINY, *extra, "--json"])
    assert result.exit_code == 2 and says in json.loads(result.stdout)["error"]["message"]
