"""`- preset:` entries the happy path does not take (scenario/presets.py): misspelt and
missing names, foreign keys, and `set:` values the fault refuses, each at file:line:col."""

from __future__ import annotations

import pytest

from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.load import load_scenario_text
from tests.scenario.fakes import PRESETS, REGISTRY

WITH_TWO_DELAYS = {**PRESETS, "two-delays": "- delay: {delay: 1s}\n- cut\n- delay: {delay: 2s}\n"}


def problems_of(path_entry: str) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(
            f"name: x\npath:\n  - {path_entry}\n", REGISTRY, file="s.yaml", presets=PRESETS
        )
    return [str(problem) for problem in caught.value.problems]


def test_a_misspelt_preset_offers_the_closest_name_and_lists_all() -> None:
    assert problems_of("preset: slow-hopp") == [
        "s.yaml:3:13: path[0]: unknown preset 'slow-hopp' (did you mean 'slow-hop'?); "
        "valid presets: broken-hop, slow-hop"
    ]


def test_a_preset_block_without_a_name_is_an_unknown_preset_at_the_block() -> None:
    assert problems_of("preset: {set: {delay: {delay: 1s}}}") == [
        "s.yaml:3:13: path[0]: unknown preset ''; valid presets: broken-hop, slow-hop"
    ]


def test_a_key_other_than_name_and_set_is_refused_at_that_key() -> None:
    assert problems_of("preset: {name: slow-hop, with: 1}") == [
        "s.yaml:3:30: path[0]: a preset takes `name: PRESET` and `set: {fault: {field: "
        "value}}`, not 'with'"
    ]


def test_a_set_value_the_fault_refuses_is_reported_at_the_set_fields() -> None:
    assert problems_of("preset: {name: slow-hop, set: {delay: {delay: 2h}}}") == [
        "s.yaml:3:43: path[0] preset 'slow-hop' set delay: delay above 60s is a stall, not a delay"
    ]


def test_an_unknown_field_in_set_lists_the_fault_s_fields_with_their_kinds() -> None:
    assert problems_of("preset: {name: slow-hop, set: {delay: {nope: 1}}}") == [
        "s.yaml:3:44: path[0] preset 'slow-hop' set delay: unknown field 'nope'; valid "
        "fields: delay (duration), mode (one of 'fixed', 'jitter')"
    ]


def test_set_changes_every_fault_of_that_name_and_keeps_their_other_fields() -> None:
    scenario = load_scenario_text(
        "name: x\npath:\n  - preset: {name: two-delays, set: {delay: {mode: jitter}}}\n",
        REGISTRY,
        presets=WITH_TWO_DELAYS,
    )
    assert [(spec.name, dict(spec.config)) for spec in scenario.path] == [
        ("delay", {"delay": 1.0, "mode": "jitter"}),
        ("cut", {}),
        ("delay", {"delay": 2.0, "mode": "jitter"}),
    ]
