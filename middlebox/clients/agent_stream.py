"""Agent streams on the client side (pure): tool-call accumulation, partial JSON, keys.

vLLM streams a tool call as a first `delta.tool_calls` entry carrying `index`, `id`,
`type` and `function.name`, then one entry per argument fragment carrying only `index`
and `function.arguments` (tool-call-named-stream.txt of the 0.32 captures). The arguments
are JSON only once the last fragment arrived; so is a `response_format` answer
(json-schema-stream.txt). The seed article's rule: "execute only after the call is
complete". This module has the pieces every built-in client shares:

- `ToolCallAccumulator`: the fragments of each call by `index`, as openai-python's
  documented loop accumulates them;
- `parse_partial_json`: what a streaming UI's partial-JSON parser (the Vercel AI SDK's
  `parsePartialJson`, partial-json-parser) makes of a prefix: it closes open strings,
  arrays and objects and drops a dangling key, so a cut prefix "parses" into a value
  the server never sent. Only the naive client acts on it;
- `idempotency_key`: one key per logical tool call, the same on every attempt (a
  retried request draws a new call `id`, so the id cannot be the key).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    """One streamed tool call: its index in the response, id, name and the argument
    fragments so far."""

    index: int
    id: str | None = None
    name: str = ""
    fragments: list[str] = field(default_factory=list)

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)

    def parsed(self) -> tuple[bool, Any]:
        """(True, value) when the arguments are complete JSON, else (False, None)."""
        try:
            return True, json.loads(self.arguments)
        except ValueError:
            return False, None


@dataclass
class ToolCallAccumulator:
    """Tool calls of one attempt by `index`, from `delta.tool_calls` entries."""

    calls: dict[int, ToolCall] = field(default_factory=dict)

    def feed(self, entries: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[ToolCall]:
        """Add one chunk's entries; returns the calls that got an argument fragment."""
        touched: list[ToolCall] = []
        for entry in entries:
            index = entry.get("index", 0)
            if not isinstance(index, int):
                continue
            call = self.calls.setdefault(index, ToolCall(index))
            if isinstance(entry.get("id"), str):
                call.id = entry["id"]
            function = entry.get("function")
            if not isinstance(function, dict):
                continue
            if isinstance(function.get("name"), str):
                call.name += function["name"]
            fragment = function.get("arguments")
            if isinstance(fragment, str) and fragment:
                call.fragments.append(fragment)
                touched.append(call)
        return touched

    def ordered(self) -> list[ToolCall]:
        return [self.calls[index] for index in sorted(self.calls)]


_CLOSERS = {"{": "}", "[": "]"}


def parse_partial_json(text: str) -> tuple[bool, Any]:
    """Parse a JSON prefix the way a partial-JSON parser does: (True, value) for a
    complete document, else the value with open strings, arrays and objects closed
    and a dangling key, colon or comma dropped; (False, None) when even that fails."""
    try:
        return True, json.loads(text)
    except ValueError:
        pass
    stack: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in _CLOSERS:
            stack.append(_CLOSERS[char])
        elif char in "}]" and stack:
            stack.pop()
    body = text
    if in_string:
        # An escape cut in half cannot be closed; drop it, then close the string.
        body = body[:-1] if escaped else body
        if "\\u" in body[-5:]:
            body = body[: body.rfind("\\u")]
        body += '"'
    candidates = [body]
    stripped = body.rstrip()
    # A dangling `"key"`, `"key":` or `,` inside an object has no value to close with.
    for trimmed in (stripped.rstrip(",:"), _drop_dangling_key(stripped)):
        if trimmed not in candidates:
            candidates.append(trimmed)
    closing = "".join(reversed(stack))
    for candidate in candidates:
        try:
            return True, json.loads(candidate + closing)
        except ValueError:
            continue
    return False, None


def _drop_dangling_key(text: str) -> str:
    """`{"a": 1, "b"` or `{"a": 1, "b":` without the last key (and its comma)."""
    stripped = text.rstrip().rstrip(":").rstrip()
    if not stripped.endswith('"'):
        return stripped
    start = stripped.rfind('"', 0, len(stripped) - 1)
    head = stripped[:start].rstrip() if start >= 0 else stripped
    return head.rstrip(",") if head.endswith((",", "{")) else stripped


def is_complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def idempotency_key(identity: str, index: int, name: str) -> str:
    """The key of one logical tool call: the logical request's identity (its body with
    its pinned seed), the call's position and its tool, stable across attempts."""
    digest = hashlib.sha256(f"{identity}\x00{index}\x00{name}".encode()).hexdigest()
    return f"mbx-{digest[:24]}"


def wants_json(body: dict[str, Any]) -> bool:
    """The request asked for a JSON answer (`response_format` json_object/json_schema)."""
    fmt = body.get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
