"""Agent streams (pure): tool calls, structured output and reasoning, planned per token.

What a vLLM server with `--enable-auto-tool-choice --tool-call-parser hermes` and a
reasoning parser streams, as seen on a real 0.32.0 (shared/reference/vllm-0.32-captures/
tool-call-named-stream.txt, json-schema-stream.txt):

- A named `tool_choice` makes guided decoding produce the arguments JSON only; vLLM streams a
  chunk naming the call (`id` `chatcmpl-tool-<hex>`, `type`, `index`, `function.name`, with
  `content: null`), then one chunk per token whose delta is an argument fragment, and keeps
  the engine's finish reason (`stop`, or `length` when `max_tokens` cuts it).
- `tool_choice: "required"` and `auto` both have the model write the parser's hermes markup,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` once per call, back to back
  (a real 0.32.0 under `required` wrote exactly that); the parser hides the markup tokens (no
  chunk at all: 200 tokens gave 13 chunks there), names each call in a chunk of its own once
  its name is parsed and streams its arguments in fragments. The finish reason is
  `tool_calls` when the engine stopped after a call, and stays `length` when `max_tokens` cut
  it (seen on the real 0.32.0), an empty delta `{}` when the cut lands in markup.
- `response_format` json_object / json_schema streams the JSON as ordinary content tokens; it
  is valid JSON only once complete, and the EOS that ends it comes as an empty delta `{}`.
- A reasoning parser streams the reasoning phase as `delta.reasoning` (0.32, 0.33; 0.11:
  `reasoning_content`) before the answer; `</think>` is one hidden token between them.

Arguments and JSON values are drawn from the request's JSON schema with a seeded rng and split
into fragments of 1-5 characters at seeded points, so cuts land inside strings and escapes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vllm_emulator import textgen

Mode = Literal["text", "named", "required", "auto", "json"]
# What a token's text is on the wire: answer content, reasoning, a hidden markup token, the
# token that names a tool call, or an argument fragment of one.
CONTENT, REASONING, SILENT, TOOL_NAME, TOOL_ARGS = (
    "content", "reasoning", "silent", "tool_name", "tool_args"
)  # fmt: skip

_WORDS = ("Paris", "Zürich", "São Paulo", "東京", "line\nbreak", 'say "hi"', "back\\slash",
          "tab\there", "🚀 launch", "plain", "café", "naïve")  # fmt: skip
DEFAULT_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
}


@dataclass(frozen=True)
class ToolCall:
    """One planned call: what the stream names and the arguments JSON it spells out."""

    index: int
    id: str
    name: str
    arguments: str

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "id": self.id, "name": self.name, "arguments": self.arguments}


def _tools(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    return [t for t in tools if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)]


def mode(body: Mapping[str, Any]) -> Mode:
    """How the request asks to be answered (tool_choice defaults to auto when tools are given,
    as vLLM's ChatCompletionRequest does; `none` answers in text)."""
    tools = _tools(body)
    choice = body.get("tool_choice")
    if tools and isinstance(choice, Mapping):
        return "named"
    if tools and choice == "required":
        return "required"
    if tools and choice in (None, "auto"):
        return "auto"
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") in (
        "json_object",
        "json_schema",
    ):
        return "json"
    return "text"


def tool_choice_error(body: Mapping[str, Any]) -> str | None:
    """vLLM's `check_tool_usage` model validator (protocol.py), its messages verbatim."""
    choice = body.get("tool_choice")
    if choice is None:
        return None
    if body.get("tools") is None:
        return "When using `tool_choice`, `tools` must be set."
    if choice not in ("auto", "required", "none") and not isinstance(choice, Mapping):
        return (
            f"Invalid value for `tool_choice`: {choice}! Only named tools, "
            '"none", "auto" or "required" are supported.'
        )
    if isinstance(choice, Mapping):
        usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
        function = choice.get("function")
        if not isinstance(function, Mapping):
            return f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}"
        if "name" not in function:
            return f"Expected field `name` in `function` in `tool_choice`! {usage}"
        name = function["name"]
        if not isinstance(name, str) or not name:
            return f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}"
        if not any(tool["function"].get("name") == name for tool in _tools(body)):
            return "The tool specified in `tool_choice` does not match any of the specified `tools`"
    return None


# ------------------------------------------------------------------ JSON from a schema


def json_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value valid under the schema subset vLLM's guided decoding is asked for most: object
    (properties, required), string (min/maxLength), number and integer (minimum/maximum),
    boolean, array (items, min/maxItems), enum, const, anyOf/oneOf (a seeded branch)."""
    if not isinstance(schema, Mapping):
        schema = {}
    for union in ("anyOf", "oneOf"):
        branches = schema.get(union)
        if isinstance(branches, list) and branches:
            return json_value(rng.choice(branches), rng, depth)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = rng.choice([k for k in kind if k != "null"] or ["null"])
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            # json_object (no schema) at the top: an object with something in it, as a model
            # asked for JSON writes; nested free-form objects stay empty.
            return json_value(DEFAULT_JSON_SCHEMA, rng, depth + 1) if depth == 0 else {}
        required = schema.get("required")
        required = set(required) if isinstance(required, list) else set()
        return {
            name: json_value(sub, rng, depth + 1)
            for name, sub in properties.items()
            if name in required or rng.random() < 0.7
        }
    if kind == "array":
        low = int(_bound(schema, "minItems", 1))
        high = max(low, min(int(_bound(schema, "maxItems", low + 2)), low + 3))
        count = rng.randint(low, high)
        return [json_value(schema.get("items"), rng, depth + 1) for _ in range(count)]
    if kind == "integer":
        low = math.ceil(_bound(schema, "minimum", -5))
        return rng.randint(low, max(low, math.floor(_bound(schema, "maximum", 40))))
    if kind == "number":
        bottom = _bound(schema, "minimum", -10)
        top = max(bottom, _bound(schema, "maximum", 99))
        return min(top, max(bottom, round(rng.uniform(bottom, top), 2)))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    word = rng.choice(_WORDS)
    shortest = int(_bound(schema, "minLength", 0))
    word = word + "x" * max(0, shortest - len(word))
    return word[: max(shortest, int(_bound(schema, "maxLength", len(word))))]


def _bound(schema: Mapping[str, Any], key: str, default: float) -> float:
    """A numeric schema keyword, or the default when absent or not a number: a schema the
    emulator cannot honour still gets an answer, never a 500."""
    value = schema.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default


def to_json(value: Any) -> str:
    """As vLLM writes parsed arguments back (`json.dumps(..., ensure_ascii=False)`): spaced."""
    return json.dumps(value, ensure_ascii=False)


def fragments(text: str, rng: random.Random) -> list[str]:
    """Split at seeded points, 1-5 characters each: inside strings, escapes and numbers too."""
    pieces: list[str] = []
    position = 0
    while position < len(text):
        size = rng.choice((1, 1, 2, 2, 3, 4, 5))
        pieces.append(text[position : position + size])
        position += size
    return pieces


# ------------------------------------------------------------------ planning


@dataclass(frozen=True)
class Options:
    """The emulator settings that shape agent output (EmulatorConfig's fields of the same
    name), the tool-call id length of the profile (random_uuid(): 16 hex, 0.11: 32) and the
    seed of the ids: vLLM draws a call id at random per response (make_tool_call_id), not
    from the sampling seed, so a retry pinned by `seed` gets the same arguments under a new
    id; the engine passes a seed from its own id stream."""

    reasoning_tokens: int = 0
    tool_calls_per_response: int = 1
    id_hex: int = 16
    id_seed: int = 0


def planned_calls(
    body: Mapping[str, Any], how: Mode, rng: random.Random, options: Options
) -> list[ToolCall]:
    tools = _tools(body)
    if how == "named":
        choice = body.get("tool_choice")
        assert isinstance(choice, Mapping)
        name = choice["function"]["name"]
        tools = [t for t in tools if t["function"].get("name") == name][:1]
        count = 1
    else:
        count = max(1, options.tool_calls_per_response)
    calls = []
    ids = random.Random(options.id_seed)
    for index in range(count):
        function = tools[index % len(tools)]["function"]
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        arguments = to_json(json_value(parameters, rng, 1))
        call_id = f"chatcmpl-tool-{ids.getrandbits(options.id_hex * 4):0{options.id_hex}x}"
        calls.append(ToolCall(index, call_id, str(function.get("name", "")), arguments))
    return calls


Token = tuple[str, int, str]  # (channel, tool index or -1, text)


def _call_tokens(call: ToolCall, how: Mode, rng: random.Random) -> list[Token]:
    args = [(TOOL_ARGS, call.index, piece) for piece in fragments(call.arguments, rng)]
    if how == "named":
        return args
    head = ["<tool_call>", "\n", '{"', "name", '": "', call.name]
    markup: list[Token] = [(SILENT, call.index, text) for text in head]
    # The hermes parser names the call once the name's closing quote arrives.
    markup.append((TOOL_NAME, call.index, '", "'))
    markup += [(SILENT, call.index, "arguments"), (SILENT, call.index, '": ')]
    closing = ["}", "\n", "</tool_call>"]
    return markup + args + [(SILENT, call.index, text) for text in closing]


def _body_tokens(
    body: Mapping[str, Any], how: Mode, rng: random.Random, calls: list[ToolCall]
) -> list[Token]:
    if how == "json":
        response_format = body["response_format"]
        schema: Any = DEFAULT_JSON_SCHEMA
        if response_format.get("type") == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema", {}) if isinstance(spec, Mapping) else {}
        return [(CONTENT, -1, piece) for piece in fragments(to_json(json_value(schema, rng)), rng)]
    tokens: list[Token] = []
    for call in calls:
        tokens += _call_tokens(call, how, rng)
    return tokens


@dataclass(frozen=True)
class AgentPlan:
    """A choice's plan with what each token is on the wire (textgen.Plan plus channels)."""

    plan: textgen.Plan
    mode: Mode
    channels: tuple[str, ...]
    tools: tuple[int, ...]  # the tool call index of each token, -1 for none
    tool_calls: tuple[ToolCall, ...]
    reasoning: str
    reasoning_tokens: int
    engine_finish_reason: str  # what the engine said (`stop` / `length`), before the parser
    complete: bool  # the structure (calls, JSON) closed before max_tokens cut it
    raw_answer: str  # the model's output after reasoning, markup included (what a parser sees)


def plan_choice(
    seed: int,
    body: Mapping[str, Any],
    max_tokens: int | None,
    limit: int,
    natural: tuple[int, int],
    stop: Sequence[str],
    options: Options,
) -> AgentPlan:
    """Plan one choice: `reasoning_tokens` of reasoning, one hidden `</think>`, then the
    answer (text, tool calls or JSON). `max_tokens` counts them all, as in vLLM."""
    how = mode(body)
    rng = random.Random(seed ^ 0xA6E27)
    cap = limit if max_tokens is None else max_tokens
    tokens: list[Token] = []
    if options.reasoning_tokens > 0:
        thinking = textgen.plan(seed ^ 0x7EA5, options.reasoning_tokens, 0)
        tokens += [(REASONING, -1, delta) for delta in thinking.deltas]
        tokens.append((SILENT, -1, "</think>"))
    answer_start = len(tokens)
    calls = planned_calls(body, how, rng, options) if how in ("named", "required", "auto") else []
    stop_reason: str | None = None
    if how == "text":
        room = cap - len(tokens)
        if room <= 0:
            answer_tokens: list[Token] = []
            engine_finish, complete = "length", False
        else:
            answer_max = None if max_tokens is None else room
            answer = textgen.plan_choice(seed, answer_max, room, natural, stop)
            answer_tokens = [(CONTENT, -1, delta) for delta in answer.deltas]
            engine_finish, complete = answer.finish_reason, True
            stop_reason = answer.stop_reason
        tokens = (tokens + answer_tokens)[:cap]
    else:
        tokens += _body_tokens(body, how, rng, calls)
        complete = len(tokens) + 1 <= cap
        if complete:
            tokens.append((SILENT, -1, ""))  # the EOS once the grammar (or the markup) closes
            engine_finish = "stop"
        else:
            tokens = tokens[:cap]
            engine_finish = "length"
    channels = tuple(channel for channel, _, _ in tokens)
    streamed_call = TOOL_NAME in channels or (how == "named" and TOOL_ARGS in channels)
    finish = engine_finish
    if how in ("required", "auto") and streamed_call and engine_finish == "stop":
        finish = "tool_calls"
    deltas = tuple(text if channel in (CONTENT, REASONING, TOOL_ARGS) else ""
                   for channel, _, text in tokens)  # fmt: skip
    content = "".join(d for d, c in zip(deltas, channels, strict=True) if c == CONTENT)
    reasoning = "".join(d for d, c in zip(deltas, channels, strict=True) if c == REASONING)
    plan = textgen.Plan(
        tuple(text.encode() for _, _, text in tokens), deltas, content, finish, stop_reason
    )
    raw_answer = "".join(text for _, _, text in tokens[answer_start:])
    return AgentPlan(plan, how, channels, tuple(tool for _, tool, _ in tokens), tuple(calls),
                     reasoning, channels.count(REASONING), engine_finish, complete,
                     raw_answer)  # fmt: skip
