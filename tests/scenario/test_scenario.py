"""Loading scenarios: units, defaults, and errors that point at the exact line."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults import REGISTRY
from faults.latency import Latency
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.load import load_scenario, load_scenario_text
from middlebox.scenario.units import parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("800ms", 0.8), ("2s", 2.0), ("1.5min", 90.0), (0, 0.0), ("250us", 0.00025)],
)
def test_durations_accept_unit_suffixes_and_a_bare_zero(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "size"), [("4KiB", 4096), ("1MiB", 1 << 20), ("512B", 512), (100, 100), ("2KB", 2000)]
)
def test_sizes_accept_integers_of_bytes_and_unit_suffixes(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["5 parsecs", "-1s", True, "ms"])
def test_a_bad_duration_names_the_valid_units(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_a_valid_scenario_builds_fresh_faults_with_converted_config() -> None:
    scenario = load_scenario_text(
        "name: slow\nseed: 9\npath:\n  - latency: {delay: 800ms, jitter: 10ms}\n  - latency\n",
        REGISTRY,
    )
    assert scenario.name == "slow" and scenario.seed == 9
    first, second = scenario.build_faults(), scenario.build_faults()
    assert repr(first) == repr([Latency(delay=0.8, jitter=0.01), Latency()])
    assert first[0] is not second[0]


def test_every_problem_in_a_file_is_reported_with_its_line_and_column() -> None:
    text = (
        "name: broken\n"
        "path:\n"
        "  - latncy: {delay: 1s}\n"
        "  - latency: {dely: 1s}\n"
        "  - latency: {jitter: 5 parsecs}\n"
        "colour: blue\n"
    )
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(text, REGISTRY, file="broken.yaml")
    lines = [str(problem) for problem in caught.value.problems]
    assert lines[0].startswith("broken.yaml:3:5: path[0]: unknown fault 'latncy'")
    assert "did you mean 'latency'" in lines[0]
    assert lines[1].startswith("broken.yaml:4:15: path[1] latency: unknown field 'dely'")
    assert "delay (duration)" in lines[1]
    assert lines[2].startswith("broken.yaml:5:23: path[2] latency.jitter: expected a duration")
    assert lines[3].startswith("broken.yaml:6:1: unknown top-level key 'colour'")
    assert len(lines) == 4


def test_a_choice_outside_a_literal_lists_the_choices() -> None:
    with pytest.raises(ScenarioError, match="choose one of 'both', 'upstream', 'downstream'"):
        load_scenario_text("path:\n  - latency: {direction: sideways}\n", REGISTRY)


def test_a_yaml_syntax_error_names_the_file_and_line() -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text("name: [oops\npath: []\n", REGISTRY, file="syntax.yaml")
    (problem,) = caught.value.problems
    assert (problem.file, problem.line) == ("syntax.yaml", 2)
    assert "YAML syntax error" in problem.message


def test_duplicate_keys_are_an_error_rather_than_a_silent_overwrite() -> None:
    with pytest.raises(ScenarioError, match="duplicate key 'seed'"):
        load_scenario_text("seed: 1\nseed: 2\n", REGISTRY)


def test_yaml_tags_that_would_run_code_are_refused() -> None:
    with pytest.raises(ScenarioError):
        load_scenario_text("name: !!python/object/apply:os.system ['true']\n", REGISTRY)


def test_a_fault_s_own_config_check_is_reported_at_load_time(tmp_path: Path) -> None:
    file = tmp_path / "neg.yaml"
    file.write_text("path:\n  - latency: {delay: -5}\n")
    with pytest.raises(ScenarioError, match=r"neg.yaml:2:\d+: .*negative"):
        load_scenario(file, REGISTRY)


def test_an_unreadable_file_is_a_scenario_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml", REGISTRY)


PRESETS = {
    "slow-hop": "- latency: {delay: 100ms}\n- latency: {delay: 5ms}\n",
    "broken": "- latency: {delay: soon}\n",
}


def test_a_preset_expands_to_its_faults_in_place() -> None:
    scenario = load_scenario_text(
        "path:\n  - latency: {delay: 1s}\n  - preset: slow-hop\n", REGISTRY, presets=PRESETS
    )
    assert [spec.config["delay"] for spec in scenario.path] == [1.0, 0.1, 0.005]


def test_an_unknown_preset_lists_the_valid_ones_at_its_line() -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(
            "path:\n  - preset: slow-hops\n", REGISTRY, presets=PRESETS, file="p.yaml"
        )
    (problem,) = caught.value.problems
    assert str(problem).startswith("p.yaml:2:13: path[0]: unknown preset 'slow-hops' (did you mean")
    assert "valid presets: broken, slow-hop" in problem.message


def test_a_broken_preset_is_reported_where_it_is_used() -> None:
    with pytest.raises(ScenarioError, match=r"p.yaml:2:13: path\[0\]: preset 'broken' is invalid"):
        load_scenario_text("path:\n  - preset: broken\n", REGISTRY, presets=PRESETS, file="p.yaml")


def test_a_preset_s_faults_can_be_given_new_field_values() -> None:
    scenario = load_scenario_text(
        "path:\n  - preset: {name: slow-hop, set: {latency: {jitter: 2ms}}}\n",
        REGISTRY,
        presets=PRESETS,
    )
    assert [(s.config["delay"], s.config.get("jitter")) for s in scenario.path] == [
        (0.1, 0.002),
        (0.005, 0.002),
    ]


def test_setting_a_fault_the_preset_lacks_or_a_bad_value_is_reported_at_its_line() -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(
            "path:\n"
            "  - preset: {name: slow-hop, set: {cut: {count: 1}}}\n"
            "  - preset: {name: slow-hop, set: {latency: {jitter: soon}}}\n",
            REGISTRY,
            presets=PRESETS,
            file="p.yaml",
        )
    first, second = (str(problem) for problem in caught.value.problems)
    assert first.startswith("p.yaml:2:36: path[0] preset 'slow-hop' has no 'cut' fault to set")
    assert first.endswith("its faults: latency, latency")
    assert second.startswith("p.yaml:3:54: path[1] preset 'slow-hop' set latency.jitter: expected")
