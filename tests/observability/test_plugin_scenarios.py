"""The pytest fixture's scenario argument: a file, a `Scenario`, or a dict of the YAML's
shape validated exactly as a file is (issue 17: a dict used to be a TypeError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from middlebox.run.plugin import scenario_from
from middlebox.scenario.convert import ScenarioError

ROOT = Path(__file__).resolve().parents[2]


def test_a_dict_becomes_the_same_scenario_as_its_yaml_file() -> None:
    built = scenario_from(
        {
            "name": "cut-in-code",
            "seed": 4,
            "path": [{"cut": {"after": "tokens", "count": 5}}, "latency"],
            "workload": {"requests": 1, "max_tokens": 20},
            "expect": {"client.silent_truncations": {"equals": 0, "hint": "check [DONE]"}},
        },
        ROOT,
    )
    assert (built.name, built.seed) == ("cut-in-code", 4)
    assert [spec.name for spec in built.path] == ["cut", "latency"]
    assert built.path[0].config["count"] == 5
    assert built.sections["expect_hints"] == {"client.silent_truncations": "check [DONE]"}
    assert built.source == "<dict>"


def test_a_dict_with_mistakes_gets_the_loader_s_errors_all_at_once() -> None:
    with pytest.raises(ScenarioError) as raised:
        scenario_from({"name": "x", "path": [{"cutt": {}}, {"latency": {"delay": 300}}]}, ROOT)
    messages = [problem.message for problem in raised.value.problems]
    assert any("unknown fault 'cutt'" in m and "did you mean 'cut'" in m for m in messages)
    assert any("write 300ms or 300s" in m for m in messages)


def test_a_file_is_found_as_given_or_under_the_root() -> None:
    relative = Path("scenarios/nginx-default-buffering.yaml")
    assert scenario_from(relative, ROOT).name == "nginx-default-buffering"
    loaded = scenario_from(ROOT / relative, Path("/"))
    assert scenario_from(loaded, ROOT) is loaded
