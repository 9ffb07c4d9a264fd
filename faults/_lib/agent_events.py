"""What an agent stream's SSE event carries (pure): tool-call argument fragments, reasoning.

vLLM 0.32 streams a tool call as one event with the call's `id`, `type` and
`function.name`, then one event per argument fragment, `{"index": 0, "function":
{"arguments": "<fragment>"}}` (tool-call-named-stream.txt of the captures), and a
reasoning model's thinking as `delta.reasoning` (0.32; `reasoning_content` in older
parsers) before the answer's `delta.content`. Triggers and `cut` count these to land
inside a call's arguments or inside the reasoning phase.
"""

from __future__ import annotations

import json
from typing import Any

from middlebox.core.sse import SseEvent


def _deltas(event: SseEvent) -> list[dict[str, Any]]:
    if event.is_done or not event.data.startswith("{"):
        return []
    try:
        chunk = json.loads(event.data)
    except ValueError:
        return []
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list):
        return []
    return [
        choice["delta"]
        for choice in choices
        if isinstance(choice, dict) and isinstance(choice.get("delta"), dict)
    ]


def tool_fragments(event: SseEvent) -> int:
    """Tool-call argument fragments (non-empty `function.arguments`) in one event."""
    count = 0
    for delta in _deltas(event):
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and function.get("arguments"):
                count += 1
    return count


def carries_reasoning(event: SseEvent) -> bool:
    """The event carries reasoning text (`delta.reasoning` or `delta.reasoning_content`)."""
    return any(
        isinstance(delta.get(key), str) and delta[key]
        for delta in _deltas(event)
        for key in ("reasoning", "reasoning_content")
    )


def carries_finish(event: SseEvent) -> bool:
    """The event carries a `finish_reason` (the model is done; usage and `[DONE]` follow)."""
    if event.is_done or not event.data.startswith("{"):
        return False
    try:
        chunk = json.loads(event.data)
    except ValueError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return isinstance(choices, list) and any(
        isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str)
        for choice in choices
    )
