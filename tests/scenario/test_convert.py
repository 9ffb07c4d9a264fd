"""The converter: YAML nodes to checked dataclasses, every problem at its line and column."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from middlebox.core.fault import Bytes, Seconds
from middlebox.scenario.convert import (
    Converter,
    Invalid,
    Problem,
    ProblemCollector,
    ScenarioError,
    config_fields,
    describe_type,
    did_you_mean,
)


@dataclass(frozen=True)
class Window:
    """A nested block, converted from a mapping."""

    start: Seconds = 0.0
    size: Bytes = 0


@dataclass(frozen=True)
class Settings:
    """A small config with one field of each kind the converter knows."""

    status: Literal["502", "504"] = "502"
    timeout: Seconds | None = None
    ratio: float = 1.0
    count: int = 1
    verbose: bool = False
    names: list[str] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    computed: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError("count cannot be negative")


def convert(text: str) -> tuple[object, list[Problem]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    finally:
        loader.dispose()
    problems = ProblemCollector("settings.yaml")
    try:
        return Converter(loader, problems).dataclass(node, Settings, "settings"), problems.problems
    except Invalid:
        return None, problems.problems


def test_a_mapping_becomes_the_dataclass_with_units_and_nested_blocks_converted() -> None:
    value, problems = convert(
        "status: 504\ntimeout: 800ms\nratio: 2\nnames: [a, b]\n"
        "windows:\n  - {start: 1.5min, size: 4KiB}\n"
    )
    assert problems == []
    assert value == Settings(
        status="504",  # YAML reads 504 as an int; the Literal's choice is the string
        timeout=0.8,
        ratio=2.0,
        names=["a", "b"],
        windows=[Window(start=90.0, size=4096)],
    )


def test_null_is_accepted_where_the_type_allows_none() -> None:
    value, problems = convert("timeout: null\n")
    assert problems == [] and value == Settings(timeout=None)


def test_an_empty_document_gives_the_defaults() -> None:
    value, problems = convert("")
    assert problems == [] and value == Settings()


@pytest.mark.parametrize(
    ("text", "line", "column", "says"),
    [
        ("count: true\n", 1, 8, "settings.count: expected integer, got True"),
        ("verbose: 1\n", 1, 10, "settings.verbose: expected boolean, got 1"),
        ("status: 500\n", 1, 9, "500 is not valid; choose one of '502', '504'"),
        ("windows:\n  - {size: 1.5KiB}\n", 2, 12, "settings.windows[0].size: expected a size"),
        ("names: a\n", 1, 8, "settings.names: expected list of string, got 'a'"),
        ("count: -1\n", 1, 1, "settings: count cannot be negative"),
    ],
)
def test_a_value_that_will_not_go_is_reported_at_its_own_mark(
    text: str, line: int, column: int, says: str
) -> None:
    value, problems = convert(text)
    assert value is None
    assert [(p.line, p.column) for p in problems] == [(line, column)]
    assert says in problems[0].message


def test_an_unknown_field_lists_the_settable_fields_with_their_types_but_not_state() -> None:
    _, problems = convert("ratio: 1\nstatsu: 502\n")
    (problem,) = problems
    assert (problem.line, problem.column) == (2, 1)
    assert "unknown field 'statsu'" in problem.message
    assert "status (one of '502', '504')" in problem.message
    assert "timeout (duration or null)" in problem.message
    assert "computed" not in problem.message  # init=False is state, not config


def test_every_bad_field_is_reported_not_only_the_first() -> None:
    _, problems = convert("count: x\nratio: y\nverbose: z\n")
    assert [p.line for p in problems] == [1, 2, 3]


def test_a_duplicate_key_is_a_problem_at_the_second_occurrence() -> None:
    _, problems = convert("count: 1\ncount: 2\n")
    assert [(p.line, p.message) for p in problems] == [(2, "settings: duplicate key 'count'")]


def test_a_tag_that_would_construct_python_objects_is_refused_not_run() -> None:
    value, problems = convert("verbose: !!python/name:os.system ''\n")
    assert value is None
    assert [(p.line, p.column) for p in problems] == [(1, 10)]
    assert "unsupported YAML value" in problems[0].message


def test_config_fields_are_the_init_fields_with_resolved_annotations() -> None:
    fields = config_fields(Settings)
    assert list(fields) == ["status", "timeout", "ratio", "count", "verbose", "names", "windows"]
    assert fields["timeout"][1] == Seconds | None


@pytest.mark.parametrize(
    ("tp", "name"),
    [
        (Seconds, "duration"),
        (Bytes, "size"),
        (Seconds | None, "duration or null"),
        (list[Window], "list of mapping (Window)"),
        (dict[str, int], "mapping of integer"),
        (Literal["a", "b"], "one of 'a', 'b'"),
    ],
)
def test_types_have_short_human_names(tp: object, name: str) -> None:
    assert describe_type(tp) == name


def test_did_you_mean_offers_the_closest_known_name_or_nothing() -> None:
    assert did_you_mean("latncy", {"latency": 1, "cut": 2}) == " (did you mean 'latency'?)"
    assert did_you_mean("zzz", {"latency": 1}) == ""


def test_a_scenario_error_lists_its_problems_in_file_order() -> None:
    error = ScenarioError([Problem("f.yaml", 9, 1, "late"), Problem("f.yaml", 2, 5, "early")])
    assert [p.message for p in error.problems] == ["early", "late"]
    assert str(error.problems[0]) == "f.yaml:2:5: early"
