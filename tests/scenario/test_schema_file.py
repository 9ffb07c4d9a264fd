"""The committed schema editors use (`schema/scenario.schema.json`): current with the
registry, valid JSON Schema 2020-12, accepting every shipped scenario and refusing the
mistakes `validate` refuses (a typo in a fault name, a duration without its unit), checked
with a real JSON Schema validator (jsonschema), not with our own reading of the schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from middlebox.compose import json_schema, validate_paths
from middlebox.library import scenario_dir
from middlebox.scenario.schema import SCHEMA_ID

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "schema" / "scenario.schema.json"
SHIPPED = sorted(scenario_dir().glob("*.yaml"))


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(COMMITTED.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(document: Any) -> list[str]:
    return [error.message for error in validator().iter_errors(document)]


def test_the_committed_schema_is_the_one_middlebox_generates() -> None:
    assert json.loads(COMMITTED.read_text()) == json_schema(), (
        "schema/scenario.schema.json is stale: run `middlebox schema > schema/scenario.schema.json`"
    )
    assert json_schema()["$id"] == SCHEMA_ID


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_scenario_validates_against_the_committed_schema(path: Path) -> None:
    assert errors(yaml.safe_load(path.read_text())) == []


def test_the_library_is_complete_and_loads_too() -> None:
    assert len(SHIPPED) >= 34
    good, problems = validate_paths(SHIPPED)
    assert problems == [] and len(good) == len(SHIPPED)


def test_quiet_faults_are_fault_names() -> None:
    base = {"name": "q", "path": ["cut"]}
    assert errors({**base, "quiet_faults": ["cut", "idle_reaper"]}) == []
    (message,) = errors({**base, "quiet_faults": ["idle_reeper"]})
    assert "'idle_reeper' is not one of" in message and "'idle_reaper'" in message


def test_a_typo_in_a_fault_name_is_reported_against_the_fault_names() -> None:
    found = errors({"name": "t", "path": [{"cutt": {"after": "tokens"}}]})
    assert any(m.startswith("'cutt' is not one of ['bandwidth'") for m in found)
    assert len(found) <= 2  # no page of noise: the names, and that no entry matched
    assert any(
        m.startswith("'cutt' is not one of") for m in errors({"name": "t", "path": ["cutt"]})
    )


def test_a_duration_needs_its_unit_in_the_schema_as_in_the_loader() -> None:
    def path(delay: Any) -> dict[str, Any]:
        return {"name": "d", "path": [{"latency": {"delay": delay}}]}

    assert errors(path("300ms")) == [] and errors(path(0)) == []
    assert errors(path(300)) != [] and errors(path("300")) != []


def test_expect_rules_take_conditions_and_a_hint() -> None:
    base = {"name": "e", "path": []}
    rules = {
        "client.complete": 2,
        "client.silent_truncations": {"equals": 0, "hint": "check finish_reason"},
        "raw": {"client.silent_truncations": {"equals": 1, "hint": "raw trusts a close"}},
    }
    assert errors({**base, "expect": rules}) == []
    assert errors({**base, "expect": {"client.complete": {"atmost": 2}}}) != []
