"""Paths inside a scenario (`upstream: {cassette: ...}`) mean the same from any current
directory: they resolve against the scenario file, and a missing file is a scenario
problem at its line, found by `validate`, not a client failure in a run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from middlebox.compose import load, validate_paths
from middlebox.scenario.convert import ScenarioError

SCENARIO = """\
name: replayed
path: []
upstream:
  cassette: tapes/answer.json
"""


def write(root: Path) -> Path:
    (root / "scenarios").mkdir()
    (root / "scenarios" / "tapes").mkdir()
    (root / "scenarios" / "tapes" / "answer.json").write_text("{}")
    scenario = root / "scenarios" / "replayed.yaml"
    scenario.write_text(SCENARIO)
    return scenario


def test_a_cassette_path_resolves_against_the_scenario_file_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = write(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    upstream = load(os.path.relpath(scenario, elsewhere)).sections["upstream"]
    assert upstream.cassette == str(tmp_path / "scenarios" / "tapes" / "answer.json")


def test_a_missing_cassette_is_a_scenario_problem_at_its_line(tmp_path: Path) -> None:
    scenario = write(tmp_path)
    (tmp_path / "scenarios" / "tapes" / "answer.json").unlink()
    with pytest.raises(ScenarioError) as raised:
        load(scenario)
    (problem,) = raised.value.problems
    assert (problem.line, problem.column) == (4, 13)
    assert "upstream: cassette: no such file:" in problem.message
    assert "relative to the scenario file" in problem.message
    good, problems = validate_paths([scenario])
    assert good == [] and len(problems) == 1  # `validate` says so too


def test_an_absolute_cassette_path_is_kept(tmp_path: Path) -> None:
    scenario = write(tmp_path)
    tape = tmp_path / "scenarios" / "tapes" / "answer.json"
    scenario.write_text(SCENARIO.replace("tapes/answer.json", str(tape)))
    assert load(scenario).sections["upstream"].cassette == str(tape)
