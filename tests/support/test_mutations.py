"""Each planted bug swaps something in the package, and ``plant`` undoes it after the test: a bug
whose target was renamed fails here by name, not as a mutation test that silently passes a
clean run."""

import pytest

pytest.importorskip("torch", reason="torch is not installed")

from tests.support.mutations import BUGS, install  # noqa: E402


@pytest.mark.parametrize("name", sorted(BUGS))
def test_every_bug_swaps_a_function_of_the_package(name):
    swapped = []
    install(name, lambda obj, attr, value: swapped.append((obj.__name__, attr)))
    assert swapped and all(mod.startswith(("ntp_planner.", "StageModel", "Coordinator")) for mod, _ in swapped)


def test_a_planted_bug_is_gone_after_the_test(monkeypatch):
    from ntp_planner.executor.parallel import ownership
    from tests.support.mutations import plant

    with monkeypatch.context() as m:
        plant(m, "cuts-reversed")
        assert ownership.contiguous(5, 2) == ((0, 2), (2, 5))  # fuller rank last
    assert ownership.contiguous(5, 2) == ((0, 3), (3, 5))
