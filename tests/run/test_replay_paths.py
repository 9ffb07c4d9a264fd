"""A report names its scenarios so that `replay` finds them from anywhere: report.json records
a library scenario by its name and any other file by its absolute path, and a report that
recorded a path relative to where its run started is replayed from another folder with the
file beside the report or in the folder above it (`--report out/`); a library file of
another install is replayed by its name, and a scenario found nowhere is one error naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import middlebox.run.replay as replay_module
from middlebox.library import scenario_dir
from middlebox.run.outcome import RunError, SuiteOutcome
from middlebox.run.replay import replay_report, scenario_paths
from middlebox.run.suite import recorded_path

SCENARIO = "name: ours\npath: []\n"


def test_a_report_records_a_library_scenario_by_name_and_a_file_of_ours_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "our-gateway.yaml").write_text(SCENARIO)
    assert recorded_path(scenario_dir() / "reset-mid-stream.yaml") == "reset-mid-stream"
    assert recorded_path(Path("scenarios/our-gateway.yaml")) == str(
        tmp_path / "scenarios" / "our-gateway.yaml"
    )


def test_a_copy_of_a_library_scenario_is_recorded_as_the_copy(tmp_path: Path) -> None:
    copy = tmp_path / "reset-mid-stream.yaml"
    copy.write_text((scenario_dir() / "reset-mid-stream.yaml").read_text())
    assert recorded_path(copy) == str(copy)


def test_relative_paths_are_found_beside_the_report_or_the_folder_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "scenarios").mkdir(parents=True)
    (project / "scenarios" / "our-gateway.yaml").write_text(SCENARIO)
    (project / "out").mkdir()
    (project / "out" / "mine.yaml").write_text(SCENARIO)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    recorded = ["scenarios/our-gateway.yaml", "mine.yaml", "reset-mid-stream"]
    assert scenario_paths(recorded, project / "out" / "report.json") == [
        str(project / "scenarios" / "our-gateway.yaml"),
        str(project / "out" / "mine.yaml"),
        "reset-mid-stream",
    ]


def test_a_path_that_is_there_as_written_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for folder in (tmp_path / "run" / "scenarios", tmp_path / "run" / "out" / "scenarios"):
        folder.mkdir(parents=True)
        (folder / "our-gateway.yaml").write_text(SCENARIO)
    monkeypatch.chdir(tmp_path / "run")
    found = scenario_paths(["scenarios/our-gateway.yaml"], tmp_path / "run/out/report.json")
    assert found == ["scenarios/our-gateway.yaml"]


def test_a_library_file_of_another_install_is_replayed_by_its_name(tmp_path: Path) -> None:
    gone = "/old/venv/lib/python3.12/site-packages/middlebox/library/scenarios/inband-error.yaml"
    assert scenario_paths([gone], tmp_path / "report.json") == ["inband-error"]


@pytest.mark.parametrize(
    "recorded",
    [
        "scenarios/our-gateway.yaml",
        "/nowhere/scenarios/our-gateway.yaml",
        "/old/venv/middlebox/library/scenarios/no-such-library-scenario.yaml",
    ],
)
def test_a_scenario_found_nowhere_is_one_error_naming_it(tmp_path: Path, recorded: str) -> None:
    with pytest.raises(RunError, match=f"scenario {recorded} not found"):
        scenario_paths([recorded], tmp_path / "out" / "report.json")


def test_replay_reruns_the_scenarios_where_the_report_found_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "our-gateway.yaml").write_text(SCENARIO)
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    run = {"paths": ["scenarios/our-gateway.yaml"], "clients": ["raw"], "seed": 5}
    report.write_text(json.dumps({"run": run, "scenarios": []}))
    seen: dict[str, Any] = {}

    def rerun(paths: list[str], **options: Any) -> SuiteOutcome:
        seen.update(paths=paths, **options)
        return SuiteOutcome([], 5, ["raw"])

    monkeypatch.setattr(replay_module, "run_suite", rerun)
    monkeypatch.chdir(tmp_path / "out")
    result = replay_report(report, None)
    assert result.same
    assert seen["paths"] == [str(tmp_path / "scenarios" / "our-gateway.yaml")]
    assert (seen["client_names"], seen["seed"]) == (["raw"], 5)
