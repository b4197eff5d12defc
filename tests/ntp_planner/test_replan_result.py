"""ReplanResult, the artifact beside Plan: it reads back what `ntp replan -o` wrote, and refuses
a file that is no re-plan or one made for a plan of another size, in one sentence."""

import json

import pytest

from ntp_planner.failures.replan import Replanner
from ntp_planner.replan_result import ReplanResult
from tests.ntp_planner.failures.test_replan import two_replicas
from topologies.errors import InputError


def test_a_saved_replan_loads_back_equal_and_checked_against_its_plan(tmp_path):
    plan = two_replicas()
    result = Replanner(plan).replan(frozenset({3}), "ntp")
    path = tmp_path / "r.json"
    path.write_text(result.model_dump_json())
    assert ReplanResult.load(path, plan) == result
    data = json.loads(path.read_text())
    data["rank_to_gpu"] = data["rank_to_gpu"][:8]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"has 8 ranks but the plan has 16; export the plan it was made from$"):
        ReplanResult.load(path, plan, "export")
    path.write_text(json.dumps({"policy": "ntp"}))
    with pytest.raises(InputError, match=r"is not a re-plan written by `ntp replan -o`: "):
        ReplanResult.load(path, plan)
