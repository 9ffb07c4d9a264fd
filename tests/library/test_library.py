"""The scenario library: every file validates, tells its incident, checks something, and
together they exercise every fault in the registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults import REGISTRY
from middlebox.compose import load
from middlebox.library import scenario_dir

LIBRARY = sorted(scenario_dir().glob("*.yaml"))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_each_scenario_describes_its_incident_and_expects_something(path: Path) -> None:
    scenario = load(path)
    assert scenario.name == path.stem, "the file is named after the scenario"
    assert len(scenario.description.split()) >= 15, "describe the real incident"
    assert scenario.sections.get("expect"), "a scenario without expect: proves nothing"
    assert not scenario.warnings, [str(w) for w in scenario.warnings]


def test_every_fault_is_used_by_at_least_one_scenario() -> None:
    used = {spec.name for path in LIBRARY for spec in load(path).path}
    assert set(REGISTRY) - used == set()
