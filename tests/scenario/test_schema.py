"""The JSON Schema: generated from the registry, and accepting what the loader accepts."""

from __future__ import annotations

import re
from typing import Any

from middlebox.scenario.model import ProxyOptions
from middlebox.scenario.schema import (
    json_schema_for_dataclass,
    json_schema_for_type,
    scenario_json_schema,
)
from middlebox.scenario.units import DURATION_PATTERN, SIZE_PATTERN, parse_duration
from middlebox.scenario.workload import Workload
from tests.scenario.fakes import PRESETS, REGISTRY, Cut, Delay


def entry_for(schema: dict[str, Any], fault: str) -> dict[str, Any]:
    for entry in schema["properties"]["path"]["items"]["anyOf"]:
        if entry.get("required") == [fault]:
            return entry["properties"][fault]["anyOf"][0]  # type: ignore[no-any-return]
    raise AssertionError(f"no schema entry for {fault}")


def test_the_schema_is_draft_2020_12_and_refuses_unknown_top_level_keys() -> None:
    schema = scenario_json_schema(REGISTRY)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {
        *("name", "description", "seed", "proxy", "path", "quiet_faults")
    }


def test_every_registered_fault_may_be_written_bare_or_with_its_config() -> None:
    entries = scenario_json_schema(REGISTRY)["properties"]["path"]["items"]["anyOf"]
    assert {"const": "delay"} in entries and {"const": "cut"} in entries
    delay = entry_for(scenario_json_schema(REGISTRY), "delay")
    assert set(delay["properties"]) == {"delay", "mode"}
    assert delay["additionalProperties"] is False
    assert delay["description"] == "Holds every item for `delay`."


def test_a_duration_is_zero_or_a_string_with_a_unit_of_the_loader_s_pattern() -> None:
    delay = entry_for(scenario_json_schema(REGISTRY), "delay")["properties"]["delay"]
    zero, text = delay["anyOf"]
    assert zero == {"const": 0}  # a bare number is an error, except 0 (zero in every unit)
    assert text["pattern"] == DURATION_PATTERN.pattern
    # The pattern a schema-aware editor checks is the one the loader parses with.
    for written in ("250ms", "1.5min", "2s"):
        assert re.match(text["pattern"], written) and parse_duration(written) >= 0
    assert not re.match(text["pattern"], "2")
    assert delay["default"] == "0"


def test_a_size_is_an_integer_or_a_string_of_the_loader_s_pattern() -> None:
    buffer = json_schema_for_dataclass(Cut)["properties"]["buffer"]
    assert buffer["anyOf"] == [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": SIZE_PATTERN.pattern},
    ]
    assert buffer["default"] == 4096


def test_literals_become_enums_and_optional_fields_admit_null() -> None:
    assert json_schema_for_dataclass(Delay)["properties"]["mode"]["enum"] == ["fixed", "jitter"]
    after = json_schema_for_dataclass(Cut)["properties"]["after_events"]
    assert after == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert "default" not in after  # None is not written as a default


def test_lists_and_mappings_describe_their_items() -> None:
    assert json_schema_for_type(list[int]) == {"type": "array", "items": {"type": "integer"}}
    assert json_schema_for_type(dict[str, bool]) == {
        "type": "object",
        "additionalProperties": {"type": "boolean"},
    }


def test_the_proxy_block_is_described_from_proxy_options() -> None:
    proxy = scenario_json_schema(REGISTRY)["properties"]["proxy"]
    assert proxy == json_schema_for_dataclass(ProxyOptions)
    assert proxy["properties"]["on_upstream_unreachable"]["enum"] == ["502", "reset", "close"]


def test_preset_names_are_an_enum_when_presets_are_given_and_any_string_otherwise() -> None:
    def preset_entry(schema: dict[str, Any]) -> dict[str, Any]:
        entries = schema["properties"]["path"]["items"]["anyOf"]
        (entry,) = [e for e in entries if e.get("required") == ["preset"]]
        return entry["properties"]["preset"]["anyOf"][0]  # type: ignore[no-any-return]

    assert preset_entry(scenario_json_schema(REGISTRY, presets=PRESETS)) == {
        "enum": ["broken-hop", "slow-hop"]
    }
    assert preset_entry(scenario_json_schema(REGISTRY)) == {"type": "string"}


def test_sections_appear_with_their_dataclass_schema_or_as_free_objects() -> None:
    schema = scenario_json_schema(REGISTRY, sections={"workload": Workload, "notes": None})
    assert schema["properties"]["workload"] == json_schema_for_dataclass(Workload)
    assert schema["properties"]["notes"] == {"type": "object"}
