"""Agent requests in the `workload:` block: tools, tool_choice and response_format.

A scenario writes them as the OpenAI fields of the same name; the loader keeps them as plain
data and `request_body` sends them verbatim in every chat request, so a client under test asks
the upstream for a tool call or structured output exactly as an agent would.
"""

from __future__ import annotations

import pytest

from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.load import load_scenario_text
from middlebox.scenario.workload import Workload, request_body
from tests.scenario.fakes import REGISTRY

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

SCENARIO = """\
name: agent
workload:
  max_tokens: 30
  tools:
    - type: function
      function:
        name: get_weather
        description: Current weather in a city
        parameters:
          type: object
          properties:
            city: {type: string}
            days: {type: integer}
          required: [city]
  tool_choice: {type: function, function: {name: get_weather}}
  response_format: {type: json_object}
"""


def test_a_scenario_workload_carries_tools_tool_choice_and_response_format_as_plain_data() -> None:
    scenario = load_scenario_text(SCENARIO, REGISTRY, sections={"workload": Workload})
    workload = scenario.sections["workload"]
    assert workload.tools == [WEATHER_TOOL]
    assert workload.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert workload.response_format == {"type": "json_object"}


def test_a_chat_request_sends_the_agent_fields_verbatim_after_the_messages() -> None:
    workload = Workload(tools=[WEATHER_TOOL], tool_choice="required")
    body = request_body(workload, "m", "[tag]")
    assert body["tools"] == [WEATHER_TOOL]
    assert body["tool_choice"] == "required"
    assert "response_format" not in body
    keys = list(body)
    assert keys.index("messages") < keys.index("tools") < keys.index("tool_choice")


def test_a_plain_workload_sends_none_of_the_agent_fields() -> None:
    body = request_body(Workload(), "m", "[tag]")
    assert not {"tools", "tool_choice", "response_format"} & set(body)


def test_agent_fields_on_the_completions_endpoint_are_refused() -> None:
    with pytest.raises(ValueError, match="need endpoint: chat"):
        Workload(endpoint="completions", response_format={"type": "json_object"})


def test_a_tool_choice_that_is_neither_a_string_nor_a_mapping_is_a_scenario_error() -> None:
    text = "name: agent\nworkload:\n  tool_choice: [auto]\n"
    with pytest.raises(ScenarioError, match="tool_choice"):
        load_scenario_text(text, REGISTRY, sections={"workload": Workload})
