"""tool-call-reset-in-arguments asks for a call a real vLLM 0.32 holds to its schema.

vLLM 0.32 with `--tool-call-parser hermes` (realvllm/serve.TOOL_CALL_FLAGS) forces a named
`tool_choice` through the parser's structural tag, `<tool_call>{"name": NAME, "arguments":
ARGS}</tool_call>`, not through the tool's JSON schema: the hermes parser declares a
`structural_tag_model`, so with VLLM_ENFORCE_STRICT_TOOL_CALLING (on by default) it no longer
`supports_required_and_named` and the JSON-schema path of `ToolParser.adjust_request` is
skipped (vllm/tool_parsers/abstract_tool_parser.py). The tag constrains ARGS to the tool's
`parameters` only for a tool marked `strict: true` (or a server at `--tool-strict-level
parameter`); any other tool's ARGS are any JSON value (structural_tag_registry.py,
`resolve_tool_strictness` and `get_function_parameters`, which returns the schema `true`). The
tier's random-weight model then wrote `false`, a number, or a string that never closed, and a
cut after the 4th argument fragment found too few fragments to fire.

So the scenario's tool is strict, and every string and array of its arguments is bounded
(xgrammar, vLLM's structured-output backend, enforces `maxLength`, `maxItems` and `pattern`):
a model that closes a string or an array only by chance still ends the call well within
`max_tokens`, so a careful client has a complete call to run on its retry. Every string has
a `pattern` too: xgrammar's JSON strings admit raw control characters, which RFC 8259
section 7 forbids and `json.loads` rejects (measured without patterns: 4 of the 7 strict calls
that finished did not parse, 3 of them with U+0006-U+001F unescaped in the title), so a
careful client would rightly refuse the whole call.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from middlebox.compose import load
from middlebox.library import scenario_dir
from middlebox.scenario.workload import Workload, request_body

SCENARIO = scenario_dir() / "tool-call-reset-in-arguments.yaml"


def unbounded(schema: Any, where: str = "arguments") -> list[str]:
    """Where a JSON schema lets a value grow without end or break JSON: a string (not an
    `enum` or `const`) without `maxLength` or without a `pattern`, an array without
    `maxItems`, an object open to more properties."""
    if not isinstance(schema, Mapping) or "enum" in schema or "const" in schema:
        return [] if isinstance(schema, Mapping) else [f"{where}: schema {schema!r}"]
    kind = schema.get("type")
    found: list[str] = []
    if kind == "string" and "maxLength" not in schema:
        found.append(f"{where}: a string without maxLength")
    if kind == "string" and "pattern" not in schema:
        found.append(f"{where}: a string without a pattern (raw control characters)")
    if kind == "array":
        if "maxItems" not in schema:
            found.append(f"{where}: an array without maxItems")
        found += unbounded(schema.get("items", True), f"{where}[]")
    if kind == "object":
        if schema.get("additionalProperties", True) is not False:
            found.append(f"{where}: an object open to more properties")
        for name, value in schema.get("properties", {}).items():
            found += unbounded(value, f"{where}.{name}")
    return found


def workload() -> Workload:
    found = load(SCENARIO).sections["workload"]
    assert isinstance(found, Workload)
    return found


def test_the_request_names_a_strict_tool_so_vllm_holds_the_arguments_to_its_schema() -> None:
    body = request_body(workload(), "chat", "[tag]")
    [tool] = body["tools"]
    assert tool["function"]["strict"] is True
    assert body["tool_choice"] == {"type": "function", "function": {"name": "create_ticket"}}
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object"
    names = {"title", "severity", "tags"}
    assert set(parameters["required"]) == set(parameters["properties"]) == names


TOOL_SCENARIOS = sorted(SCENARIO.parent.glob("tool-call-*.yaml"))


def test_every_tool_call_scenario_is_found() -> None:
    names = {path.stem for path in TOOL_SCENARIOS}
    assert {"tool-call-reset-in-arguments", "tool-call-email-retry-storm"} <= names
    assert "tool-call-inband-error" in names


@pytest.mark.parametrize("path", TOOL_SCENARIOS, ids=lambda path: path.stem)
def test_every_tool_call_scenario_asks_for_a_strict_bounded_call(path: Path) -> None:
    # The same cause in each: a non-strict named call's arguments are any JSON value
    # under vLLM 0.32's structural tag (tool-call-email-retry-storm's string body ran to
    # max_tokens, so its naive clients ran an unparsed call: partial 1 against 0).
    found = load(path).sections["workload"]
    assert isinstance(found, Workload) and found.tools
    for tool in found.tools:
        assert tool["function"].get("strict") is True, path.stem
        assert unbounded(tool["function"]["parameters"]) == [], path.stem


def test_the_bound_finder_names_each_open_end() -> None:
    loose = {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "severity": {"type": "string", "enum": ["low", "high"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}},
            "notes": {
                "type": "array",
                "items": {"type": "string", "pattern": "^a$"},
                "maxItems": 2,
            },
        },
    }
    assert unbounded(loose) == [
        "arguments: an object open to more properties",
        "arguments.title: a string without maxLength",
        "arguments.title: a string without a pattern (raw control characters)",
        "arguments.tags: an array without maxItems",
        "arguments.tags[]: a string without a pattern (raw control characters)",
        "arguments.notes[]: a string without maxLength",
    ]
    # A non-strict tool's arguments under vLLM 0.32's structural tag: the schema `true`.
    assert unbounded(True) == ["arguments: schema True"]
    assert unbounded({"const": "x"}) == []
