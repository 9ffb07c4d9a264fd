"""The `expect:` block as the loader reads it: each unknown metric or condition, and each bound
that is no number, placed at its line and column with the name it likely meant; every form the
README shows loads; a `CLIENT:` block naming no client of a run is placed where it stands."""

from __future__ import annotations

import pytest

from faults import REGISTRY
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.expect import EXPECT_CLIENTS, METRICS, client_problems
from middlebox.scenario.load import EXPECT_HINTS, load_scenario_text
from middlebox.scenario.model import Scenario

SECTIONS: dict[str, type | None] = {"expect": None}


def load(expect: str) -> Scenario:
    return load_scenario_text(
        f"name: e\npath: []\nexpect:\n{expect}", REGISTRY, file="e.yaml", sections=SECTIONS
    )


def problems_of(expect: str) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        load(expect)
    return [str(problem) for problem in caught.value.problems]


def test_a_misspelled_metric_is_placed_at_its_name_with_the_one_it_meant() -> None:
    (problem,) = problems_of("  client.silent_truncation: 0\n")
    assert problem.startswith(
        "e.yaml:4:3: expect: unknown metric 'client.silent_truncation' "
        "(did you mean 'client.silent_truncations'?); valid metrics: client.requests, "
    )
    assert "server.tokens_wasted" in problem


def test_a_misspelled_condition_is_placed_at_its_name_with_the_valid_ones() -> None:
    (problem,) = problems_of("  client.perceived_ttft_ms: {p95max: 500}\n")
    assert problem == (
        "e.yaml:4:30: expect: client.perceived_ttft_ms: unknown condition 'p95max' "
        "(did you mean 'p95_max'?); valid conditions: max, min, equals, mean_max, p50_max, "
        "p95_max, p99_max (and hint)"
    )


def test_every_problem_of_the_block_is_reported_at_once_a_client_block_s_included() -> None:
    problems = problems_of(
        "  client.silent_truncation: 0\n"
        "  client.perceived_ttft_ms: {p95max: 500}\n"
        "  raw:\n"
        "    client.silent_truncations: {min: 1}\n"
        "    client.complet: 1\n"
    )
    assert [problem.split(": expect: ")[0] for problem in problems] == [
        "e.yaml:4:3",
        "e.yaml:5:30",
        "e.yaml:8:5",
    ]
    assert (
        "expect: raw: unknown metric 'client.complet' (did you mean 'client.complete'?)"
        in (problems[2])
    )


def test_a_bound_that_is_no_number_or_boolean_is_placed_at_its_value() -> None:
    (short,) = problems_of("  client.silent_truncations: none\n")
    assert short == (
        "e.yaml:4:30: expect: client.silent_truncations: expected number or boolean, got 'none'"
    )
    (listed,) = problems_of("  server.tokens_wasted: {max: [5]}\n")
    assert (
        listed
        == "e.yaml:4:31: expect: server.tokens_wasted: max: expected number or boolean, got a list"
    )


def test_an_expect_that_is_no_mapping_and_a_repeated_metric_are_errors() -> None:
    (listed,) = problems_of("  - client.complete\n")
    assert listed == "e.yaml:4:3: expect: expected a mapping of metric names to rules"
    (twice,) = problems_of("  client.complete: 1\n  client.complete: 2\n")
    assert twice == "e.yaml:5:3: expect: duplicate key 'client.complete'"


def test_every_form_the_readme_shows_loads_with_its_hints() -> None:
    scenario = load(
        "  client.silent_truncations: 0\n"
        "  server.tokens_wasted: {max: 5}\n"
        "  client.perceived_ttft_ms: {p95_max: 500, hint: keep the first token quick}\n"
        "  server.x_accel_buffering_no: true\n"
        "  client.itl_ms: {mean_max: 40.5, p50_max: 30, p99_max: 90, min: 0}\n"
        "  raw: {client.silent_truncations: 1}      # curl -N trusts whatever arrived\n"
        "  resilient:\n"
        "    client.complete: {equals: 1, hint: it resumes}\n"
    )
    assert scenario.sections["expect"]["server.tokens_wasted"] == {"max": 5}
    assert scenario.sections["expect"]["raw"] == {"client.silent_truncations": 1}
    assert scenario.sections[EXPECT_HINTS] == {
        "client.perceived_ttft_ms": "keep the first token quick",
        "resilient/client.complete": "it resumes",
    }
    assert scenario.sections[EXPECT_CLIENTS] == {"raw": (9, 3), "resilient": (10, 3)}
    assert load("").sections[EXPECT_CLIENTS] == {}


def test_a_block_naming_no_client_of_the_run_is_placed_with_the_client_it_meant() -> None:
    scenario = load("  client.complete: 1\n  rwa: {client.complete: 0}\n")
    (problem,) = client_problems(scenario, ["raw", "openai"])
    assert str(problem) == (
        "e.yaml:5:3: expect: 'rwa' names no client (did you mean 'raw'?); clients: openai, "
        "raw (a block for your own client needs `--client-cmd rwa=COMMAND` when it runs)"
    )


def test_a_block_for_a_client_of_the_run_is_no_problem() -> None:
    scenario = load("  mine: {client.complete: 0}\n  raw: {client.complete: 0}\n")
    assert client_problems(scenario, ["raw", "mine"]) == []
    assert client_problems(Scenario(name="built", sections={"expect": {}}), ["raw"]) == []


def test_the_agent_metrics_are_expect_names() -> None:
    assert {"client.side_effects_repeated", "server.tool_call_tokens_wasted"} <= set(METRICS)
