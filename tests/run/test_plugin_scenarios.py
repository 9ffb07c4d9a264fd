"""The pytest fixture's scenario argument: a library scenario's name, a file, a `Scenario`,
or a dict of the YAML's shape validated exactly as a file is (a dict used to be a
TypeError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from middlebox.library import UnknownScenario
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
    relative = Path("middlebox/library/scenarios/nginx-default-buffering.yaml")
    assert scenario_from(relative, ROOT).name == "nginx-default-buffering"
    loaded = scenario_from(ROOT / relative, Path("/"))
    assert scenario_from(loaded, ROOT) is loaded


def test_a_library_scenario_is_found_by_name_from_any_root(tmp_path: Path) -> None:
    loaded = scenario_from("nginx-default-buffering", tmp_path)
    assert loaded.name == "nginx-default-buffering"
    assert [spec.name for spec in loaded.path] == ["proxy_buffering"]
    assert scenario_from("nginx-default-buffering.yaml", tmp_path).name == loaded.name


def test_a_file_of_the_projects_own_wins_over_the_library_name(tmp_path: Path) -> None:
    (tmp_path / "nginx-default-buffering").write_text("name: ours\npath: []\n")
    assert scenario_from("nginx-default-buffering", tmp_path).name == "ours"


def test_a_name_that_is_no_file_and_no_library_scenario_names_the_closest(
    tmp_path: Path,
) -> None:
    with pytest.raises(UnknownScenario, match="did you mean nginx-default-buffering"):
        scenario_from("nginx-default-bufering", tmp_path)
