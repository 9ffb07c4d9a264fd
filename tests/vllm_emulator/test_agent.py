"""Agent output planned per token (vllm_emulator/agent.py): tool calls, JSON, reasoning.

Pure tests: what each token is on the wire, that the arguments and JSON are valid under the
request's schema once complete (and only then), where max_tokens cuts them, and vLLM's
messages for a tool_choice it refuses.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from vllm_emulator import agent
from vllm_emulator.agent import CONTENT, REASONING, SILENT, TOOL_ARGS, TOOL_NAME

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
EMAIL = {
    "type": "function",
    "function": {
        "name": "send_email",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "urgent": {"type": "boolean"}},
            "required": ["to", "urgent"],
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "ok": {"type": "boolean"},
        "nested": {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    },
    "required": ["title", "score", "tags", "ok", "nested"],
}


def plan(
    body: dict[str, Any],
    max_tokens: int | None = None,
    seed: int = 3,
    reasoning: int = 0,
    calls: int = 1,
) -> agent.AgentPlan:
    options = agent.Options(reasoning_tokens=reasoning, tool_calls_per_response=calls)
    return agent.plan_choice(seed, body, max_tokens, 4096, (16, 64), (), options)


def valid(value: Any, schema: dict[str, Any]) -> bool:
    """A small validator for the schema subset the generator promises."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type", "object")
    if kind == "object":
        props = schema.get("properties", {})
        return (
            isinstance(value, dict)
            and all(name in value for name in schema.get("required", []))
            and all(name in props and valid(v, props[name]) for name, v in value.items())
        )
    if kind == "array":
        return (
            isinstance(value, list)
            and len(value) >= schema.get("minItems", 0)
            and all(valid(item, schema.get("items", {})) for item in value)
        )
    if kind == "integer":
        low, high = schema.get("minimum", -(10**9)), schema.get("maximum", 10**9)
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    checks: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "number": (int, float),
        "boolean": bool,
    }
    return isinstance(value, checks[kind])


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "text"),
        ({"tools": [WEATHER]}, "auto"),  # vLLM's default tool_choice once tools are given
        ({"tools": [WEATHER], "tool_choice": "auto"}, "auto"),
        ({"tools": [WEATHER], "tool_choice": "none"}, "text"),
        ({"tools": [WEATHER], "tool_choice": "required"}, "required"),
        ({"tools": [WEATHER], "tool_choice": NAMED}, "named"),
        ({"response_format": {"type": "json_object"}}, "json"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, "json"),
        ({"response_format": {"type": "text"}}, "text"),
    ],
)
def test_the_mode_follows_tool_choice_then_response_format(
    fields: dict[str, Any], expected: str
) -> None:
    assert agent.mode(fields) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set."),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
        ),
        (
            {"tools": [WEATHER], "tool_choice": "sometimes"},
            'Invalid value for `tool_choice`: sometimes! Only named tools, "none", "auto" or '
            '"required" are supported.',
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {}}},
            "Expected field `name` in `function` in `tool_choice`! Correct usage: "
            '`{"type": "function", "function": {"name": "my_function"}}`',
        ),
    ],
)
def test_a_tool_choice_vllm_refuses_gets_its_check_tool_usage_message(
    fields: dict[str, Any], message: str
) -> None:
    assert agent.tool_choice_error(fields) == message


def test_valid_tool_choices_raise_nothing() -> None:
    for choice in (None, "auto", "none", "required", NAMED):
        assert agent.tool_choice_error({"tools": [WEATHER], "tool_choice": choice}) is None


def test_generated_json_is_valid_under_the_schema_for_many_seeds() -> None:
    for seed in range(200):
        value = agent.json_value(SCHEMA, random.Random(seed))
        assert valid(value, SCHEMA), value
        assert json.loads(agent.to_json(value)) == value


def test_fragments_rejoin_exactly_and_cut_inside_strings_and_escapes() -> None:
    text = agent.to_json({"say": 'a "quoted"\nline', "city": "Zürich 🚀"})
    inside_escape = False
    for seed in range(50):
        pieces = agent.fragments(text, random.Random(seed))
        assert "".join(pieces) == text
        assert all(1 <= len(piece) <= 5 for piece in pieces)
        inside_escape |= any(piece.endswith("\\") for piece in pieces[:-1])
    assert inside_escape  # some split lands between a backslash and what it escapes


def test_a_named_call_streams_only_argument_fragments_then_the_eos() -> None:
    planned = plan({"tools": [WEATHER], "tool_choice": NAMED})
    (call,) = planned.tool_calls
    assert call.name == "get_weather" and call.index == 0
    assert call.id.startswith("chatcmpl-tool-") and len(call.id) == len("chatcmpl-tool-") + 16
    assert set(planned.channels[:-1]) == {TOOL_ARGS} and planned.channels[-1] == SILENT
    arguments = "".join(planned.plan.deltas)
    assert arguments == call.arguments == planned.raw_answer
    assert valid(json.loads(arguments), WEATHER["function"]["parameters"])  # type: ignore[index]
    assert planned.plan.finish_reason == planned.engine_finish_reason == "stop"
    assert planned.complete and planned.plan.text == ""  # no content at all


def test_a_named_call_cut_by_max_tokens_keeps_the_engines_length_and_invalid_json() -> None:
    planned = plan({"tools": [WEATHER], "tool_choice": NAMED}, max_tokens=4)
    assert planned.plan.num_tokens == 4
    assert planned.plan.finish_reason == "length" and not planned.complete
    with pytest.raises(json.JSONDecodeError):
        json.loads("".join(planned.plan.deltas))


def test_auto_hides_hermes_markup_names_each_call_once_and_finishes_with_tool_calls() -> None:
    planned = plan({"tools": [WEATHER, EMAIL]}, calls=2)
    assert planned.raw_answer.startswith('<tool_call>\n{"name": "get_weather", "arguments": {')
    assert planned.raw_answer.endswith("}}\n</tool_call>")
    assert planned.channels.count(TOOL_NAME) == 2
    assert [call.name for call in planned.tool_calls] == ["get_weather", "send_email"]
    for call in planned.tool_calls:
        pairs = zip(planned.plan.deltas, planned.channels, planned.tools, strict=True)
        streamed = [d for d, c, t in pairs if c == TOOL_ARGS and t == call.index]
        assert "".join(streamed) == call.arguments
    hidden = [d for d, c in zip(planned.plan.deltas, planned.channels, strict=True) if c == SILENT]
    assert set(hidden) == {""}  # markup never reaches a delta
    assert planned.plan.finish_reason == "tool_calls" and planned.engine_finish_reason == "stop"


def test_a_call_cut_inside_its_arguments_ends_in_length_not_tool_calls() -> None:
    # As a real 0.32.0 streamed a `required` answer cut by max_tokens: `length`, so only a
    # client that reads the reason knows the call is partial.
    for choice in ("auto", "required"):
        body = {"tools": [WEATHER], "tool_choice": choice}
        whole = plan(body)
        cut = plan(body, max_tokens=whole.channels.index(TOOL_ARGS) + 2)
        assert cut.plan.finish_reason == cut.engine_finish_reason == "length"
        assert not cut.complete and TOOL_NAME in cut.channels


def test_required_writes_the_same_hermes_markup_back_to_back() -> None:
    # A real 0.32.0 with --tool-call-parser hermes wrote `<tool_call>...</tool_call>` per
    # call under tool_choice "required", with nothing between the calls.
    planned = plan({"tools": [WEATHER, EMAIL], "tool_choice": "required"}, calls=2)
    first, second = planned.raw_answer.removeprefix("<tool_call>\n").split(
        "\n</tool_call><tool_call>\n"
    )
    assert second.endswith("\n</tool_call>")
    parsed = [json.loads(first), json.loads(second.removesuffix("\n</tool_call>"))]
    assert [item["name"] for item in parsed] == ["get_weather", "send_email"]
    assert [agent.to_json(item["arguments"]) for item in parsed] == [
        call.arguments for call in planned.tool_calls
    ]
    assert planned.plan.finish_reason == "tool_calls"


def test_json_mode_is_content_valid_only_once_complete() -> None:
    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}
    planned = plan(body)
    text = planned.plan.text
    assert valid(json.loads(text), SCHEMA)
    assert set(planned.channels[:-1]) == {CONTENT} and planned.channels[-1] == SILENT
    prefix = ""
    for delta in planned.plan.deltas[:-2]:
        prefix += delta
        with pytest.raises(json.JSONDecodeError):
            json.loads(prefix)


def test_json_object_without_a_schema_is_still_an_object() -> None:
    value = json.loads(plan({"response_format": {"type": "json_object"}}).plan.text)
    assert isinstance(value, dict) and value


def test_reasoning_comes_first_then_one_hidden_end_token_then_the_answer() -> None:
    planned = plan({}, max_tokens=12, reasoning=5)
    assert planned.channels[:5] == (REASONING,) * 5
    assert planned.channels[5] == SILENT
    assert set(planned.channels[6:]) == {CONTENT}
    assert planned.plan.num_tokens == 12  # max_tokens counts reasoning, as in vLLM
    assert planned.reasoning_tokens == 5 and planned.reasoning
    assert planned.plan.text == "".join(planned.plan.deltas[6:])


def test_reasoning_longer_than_max_tokens_never_reaches_the_answer() -> None:
    planned = plan({}, max_tokens=8, reasoning=50)
    assert set(planned.channels) == {REASONING}
    assert planned.plan.text == "" and planned.plan.finish_reason == "length"


def test_the_plan_is_a_pure_function_of_seed_and_request() -> None:
    body = {"tools": [WEATHER], "tool_choice": "required"}
    assert plan(body, seed=9) == plan(body, seed=9)
    assert plan(body, seed=9).tool_calls != plan(body, seed=10).tool_calls


@pytest.mark.parametrize(
    ("schema", "check"),
    [
        ({"type": "integer", "minimum": 3, "maximum": 3}, lambda v: v == 3),
        ({"type": "number", "minimum": 0.5, "maximum": 0.75}, lambda v: 0.5 <= v <= 0.75),
        ({"type": "string", "maxLength": 2}, lambda v: isinstance(v, str) and len(v) <= 2),
        ({"type": "string", "minLength": 30}, lambda v: len(v) >= 30),
        (
            {"anyOf": [{"type": "boolean"}, {"const": 7}]},
            lambda v: v is True or v is False or v == 7,
        ),
        ({"type": ["null", "integer"]}, lambda v: isinstance(v, int)),
        ({"type": "array", "minItems": "two"}, lambda v: isinstance(v, list)),  # junk bound
        ({"type": "object"}, lambda v: isinstance(v, dict) and v),  # top level: a default object
    ],
)
def test_schema_bounds_are_honoured_and_junk_never_crashes(
    schema: dict[str, Any], check: Any
) -> None:
    for seed in range(20):
        assert check(agent.json_value(schema, random.Random(seed)))
