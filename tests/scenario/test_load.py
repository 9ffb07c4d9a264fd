"""Loading on its own registry: the path, presets and their `set:`, limits, warnings."""

from __future__ import annotations

import pytest

from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.load import MAX_SCENARIO_BYTES, load_scenario_text
from middlebox.scenario.model import FaultSpec, ProxyOptions
from middlebox.scenario.workload import Workload
from tests.scenario.fakes import PRESETS, REGISTRY, Cut, Delay


def problems_of(text: str, **kwargs: object) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(text, REGISTRY, file="s.yaml", **kwargs)  # type: ignore[arg-type]
    return [str(problem) for problem in caught.value.problems]


def test_the_path_keeps_its_order_and_each_spec_its_line() -> None:
    scenario = load_scenario_text("name: x\npath:\n  - cut\n  - delay: {delay: 1s}\n", REGISTRY)
    assert scenario.path == (FaultSpec(Cut, {}, 3), FaultSpec(Delay, {"delay": 1.0}, 4))


def test_a_preset_expands_in_place_and_set_changes_its_fields() -> None:
    text = "name: x\npath:\n  - delay\n  - preset: {name: slow-hop, set: {cut: {buffer: 8KiB}}}\n"
    scenario = load_scenario_text(text, REGISTRY, presets=PRESETS)
    assert [(spec.name, dict(spec.config)) for spec in scenario.path] == [
        ("delay", {}),
        ("delay", {"delay": 0.2}),
        ("cut", {"buffer": 8192}),
    ]


def test_a_preset_s_own_invalid_fault_is_reported_at_the_line_using_it() -> None:
    assert problems_of("name: x\npath:\n  - preset: broken-hop\n", presets=PRESETS) == [
        "s.yaml:3:13: path[0]: preset 'broken-hop' is invalid: path[0] delay: "
        "delay above 60s is a stall, not a delay"
    ]


def test_set_on_a_fault_the_preset_lacks_names_the_faults_it_has() -> None:
    (problem,) = problems_of(
        "path:\n  - preset: {name: slow-hop, set: {gzip: {level: 1}}}\n", presets=PRESETS
    )
    assert problem.startswith("s.yaml:2:36:")
    assert "has no 'gzip' fault to set; its faults: delay, cut" in problem


def test_an_unknown_fault_offers_the_closest_name_and_lists_all() -> None:
    (problem,) = problems_of("path:\n  - dealy\n")
    assert problem == "s.yaml:2:5: path[0]: unknown fault 'dealy' (did you mean 'delay'?); " + (
        "valid faults: cut, delay"
    )


def test_only_the_sections_the_caller_allows_are_accepted() -> None:
    scenario = load_scenario_text(
        "path: []\nworkload: {max_tokens: 5}\nupstream: {anything: [1]}\n",
        REGISTRY,
        sections={"workload": Workload, "upstream": None},
    )
    assert scenario.sections["workload"].max_tokens == 5
    assert scenario.sections["upstream"] == {"anything": [1]}
    (problem,) = problems_of("path: []\nworkload: {max_tokens: 5}\n")
    assert "unknown top-level key 'workload'" in problem


def test_the_proxy_block_is_converted_and_checked() -> None:
    scenario = load_scenario_text("path: []\nproxy: {read_timeout: 30s}\n", REGISTRY)
    assert scenario.proxy == ProxyOptions(read_timeout=30.0)
    (problem,) = problems_of("path: []\nproxy: {max_connections: 0}\n")
    assert "max_connections must be at least 1" in problem


def test_a_scenario_without_a_name_is_named_after_its_file() -> None:
    assert load_scenario_text("path: []\n", REGISTRY, file="dir/slow.yaml").name == "slow"


def test_text_over_the_size_limit_is_refused_before_parsing() -> None:
    (problem,) = problems_of("#" * (MAX_SCENARIO_BYTES + 1))
    assert problem.startswith("s.yaml:1:1: too large")


def test_an_alias_bomb_is_refused_by_its_expanded_size() -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 6)]
    (problem,) = problems_of("\n".join(levels) + "\n")
    assert "YAML alias bomb" in problem


def test_a_fault_set_beyond_what_the_workload_can_produce_is_a_warning_not_an_error() -> None:
    scenario = load_scenario_text(
        "path:\n  - cut: {after_events: 50, at: 90s}\nworkload: {max_tokens: 10, timeout: 60s}\n",
        REGISTRY,
        sections={"workload": Workload},
    )
    assert [str(warning) for warning in scenario.warnings] == [
        "<string>:2:1: path[0] cut: after_events: 50 can never be reached: with workload "
        "max_tokens 10 a stream has at most 14 events",
        "<string>:2:1: path[0] cut: at: 90s is after the workload's timeout (60s): it never fires",
    ]


def test_a_misspelled_quiet_fault_offers_the_closest_name_where_it_stands() -> None:
    (problem,) = problems_of("path: [delay]\nquiet_faults: [dealy]\n")
    assert problem == (
        "s.yaml:2:16: quiet_faults[0]: unknown fault 'dealy' (did you mean 'delay'?); "
        "valid faults: cut, delay"
    )


def test_a_quiet_fault_the_path_does_not_hold_is_an_error_it_could_never_fire() -> None:
    (problem,) = problems_of("path: [delay]\nquiet_faults: [delay, cut]\n")
    assert problem == (
        "s.yaml:2:23: quiet_faults[1]: 'cut' is not in this scenario's path, so it can never "
        "fire and listing it proves nothing; quiet_faults names faults of the path (delay)"
    )
    (empty,) = problems_of("path: []\nquiet_faults: [cut]\n")
    assert empty.endswith("quiet_faults names faults of the path (the path is empty)")


def test_quiet_faults_of_the_path_and_of_its_presets_load() -> None:
    text = "path:\n  - preset: slow-hop\nquiet_faults: [cut, delay]\n"
    scenario = load_scenario_text(text, REGISTRY, presets=PRESETS)
    assert scenario.quiet_faults == ("cut", "delay")


def test_quiet_faults_wait_for_a_path_with_problems_to_be_fixed() -> None:
    # the broken entry may be the very fault listed quiet: only its own problem is reported
    (problem,) = problems_of("path:\n  - cut: {nosuch: 1}\nquiet_faults: [cut]\n")
    assert problem.startswith("s.yaml:2:11: path[0] cut: unknown field 'nosuch'")
    (typo,) = problems_of("path:\n  - cut: {nosuch: 1}\nquiet_faults: [cutt]\n")[1:]
    assert typo.startswith("s.yaml:3:16: quiet_faults[0]: unknown fault 'cutt'")
