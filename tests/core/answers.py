"""One answer written as each vLLM 0.32 streaming API writes it, for tests.

`answer_events(dialect, pieces, end=...)` gives the SSE events (bytes, each ending in its
blank line) of a stream that carries `pieces` of answer text, shaped like the recordings in
tests/core/streams/: chat with its role chunk, a finish chunk with `content: ""`, the usage
chunk and `[DONE]`; completions with `text` chunks; Responses' named events with
`sequence_number` from 0, ending in `response.completed`; Messages' named events ending in
`message_stop`. An empty piece is a step whose bytes vLLM's detokenizer held back: chat and
completions send it as an empty chunk, Responses and Messages send nothing for it (vLLM's
`resolve_target_state` and its Anthropic converter skip empty content).
"""

from __future__ import annotations

import json
from typing import Any

from middlebox.core.dialects import Dialect

PATHS = {
    Dialect.CHAT: "/v1/chat/completions",
    Dialect.COMPLETIONS: "/v1/completions",
    Dialect.RESPONSES: "/v1/responses",
    Dialect.MESSAGES: "/v1/messages",
}


def data_event(payload: dict[str, Any] | str, name: str | None = None) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    head = f"event: {name}\n" if name is not None else ""
    return f"{head}data: {data}\n\n".encode()


def _chat(pieces: list[str], end: str) -> list[bytes]:
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    chunk = {"object": "chat.completion.chunk", "choices": [first]}
    events = [data_event(chunk)]
    for piece in pieces:
        choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
        events.append(data_event({"object": "chat.completion.chunk", "choices": [choice]}))
    last = {"index": 0, "delta": {"content": ""}, "finish_reason": end}
    events.append(data_event({"object": "chat.completion.chunk", "choices": [last]}))
    usage = {"completion_tokens": len(pieces) + 1}
    events.append(data_event({"object": "chat.completion.chunk", "choices": [], "usage": usage}))
    return [*events, data_event("[DONE]")]


def _completions(pieces: list[str], end: str) -> list[bytes]:
    events = []
    for number, piece in enumerate(pieces):
        finish = end if number == len(pieces) - 1 else None
        choice = {"index": 0, "text": piece, "finish_reason": finish}
        events.append(data_event({"object": "text_completion", "choices": [choice]}))
    return [*events, data_event("[DONE]")]


def _responses(pieces: list[str], end: str) -> list[bytes]:
    events: list[bytes] = []

    def add(kind: str, **fields: Any) -> None:
        events.append(data_event({**fields, "sequence_number": len(events), "type": kind}, kind))

    status = "incomplete" if end == "length" else "completed"
    details = {"reason": "max_output_tokens"} if end == "length" else None
    response = {"id": "resp_1", "object": "response", "status": "in_progress"}
    add("response.created", response=response)
    add("response.in_progress", response=response)
    add("response.output_item.added", output_index=0, item={"id": "msg_1", "type": "message"})
    add("response.content_part.added", content_index=0, item_id="msg_1", output_index=0)
    for piece in pieces:
        if piece:
            add("response.output_text.delta", content_index=0, delta=piece, item_id="msg_1")
    text = "".join(pieces)
    add("response.output_text.done", content_index=0, item_id="msg_1", text=text)
    add("response.content_part.done", content_index=0, item_id="msg_1", output_index=0)
    add("response.output_item.done", output_index=0, item={"id": "msg_1", "status": "completed"})
    final = {**response, "status": status, "incomplete_details": details}
    add("response.completed", response=final)
    return events


def _messages(pieces: list[str], end: str) -> list[bytes]:
    stop = "max_tokens" if end == "length" else "end_turn"
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    events = [
        data_event({"type": "message_start", "message": message}, "message_start"),
        data_event(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            "content_block_start",
        ),
    ]
    for piece in pieces:
        if piece:
            delta = {"type": "text_delta", "text": piece}
            payload = {"type": "content_block_delta", "index": 0, "delta": delta}
            events.append(data_event(payload, "content_block_delta"))
    events.append(data_event({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    stop_delta = {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {}}
    events.append(data_event(stop_delta, "message_delta"))
    return [*events, data_event({"type": "message_stop"}, "message_stop")]


THOUGHTS = ["Let", " me", " think"]
FRAGMENTS = ['{"city"', ': "Par', 'is"}']


def _agent_chat(thoughts: list[str], text: str, fragments: list[str]) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return data_event({"object": "chat.completion.chunk", "choices": [choice]})

    name = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather"}}
    usage = {"object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": 9}}
    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"reasoning": t}) for t in thoughts),
        chunk({"content": text}),
        chunk({"tool_calls": [name]}),
        *(chunk({"tool_calls": [{"index": 0, "function": {"arguments": f}}]}) for f in fragments),
        chunk({}, "tool_calls"),
        data_event(usage),
        data_event("[DONE]"),
    ]


def _agent_responses(thoughts: list[str], text: str, fragments: list[str]) -> list[bytes]:
    events: list[bytes] = []

    def add(kind: str, **fields: Any) -> None:
        events.append(data_event({**fields, "sequence_number": len(events), "type": kind}, kind))

    response = {"id": "resp_1", "object": "response", "status": "in_progress"}
    add("response.created", response=response)
    add("response.in_progress", response=response)
    add("response.output_item.added", output_index=0, item={"id": "rs_1", "type": "reasoning"})
    for t in thoughts:
        add("response.reasoning_text.delta", content_index=0, delta=t, item_id="rs_1")
    add("response.reasoning_text.done", content_index=0, item_id="rs_1", text="".join(thoughts))
    add("response.output_item.done", output_index=0, item={"id": "rs_1", "type": "reasoning"})
    add("response.output_item.added", output_index=1, item={"id": "msg_1", "type": "message"})
    add("response.content_part.added", content_index=0, item_id="msg_1", output_index=1)
    add("response.output_text.delta", content_index=0, delta=text, item_id="msg_1")
    add("response.output_text.done", content_index=0, item_id="msg_1", text=text)
    add("response.content_part.done", content_index=0, item_id="msg_1", output_index=1)
    add("response.output_item.done", output_index=1, item={"id": "msg_1", "type": "message"})
    call = {"id": "fc_1", "type": "function_call", "name": "weather", "arguments": ""}
    add("response.output_item.added", output_index=2, item=call)
    for f in fragments:
        add("response.function_call_arguments.delta", delta=f, item_id="fc_1", output_index=2)
    whole = "".join(fragments)
    add("response.function_call_arguments.done", arguments=whole, item_id="fc_1", output_index=2)
    add("response.output_item.done", output_index=2, item={**call, "arguments": whole})
    add("response.completed", response={**response, "status": "completed"})
    return events


def _agent_messages(thoughts: list[str], text: str, fragments: list[str]) -> list[bytes]:
    def named(payload: dict[str, Any]) -> bytes:
        return data_event(payload, str(payload["type"]))

    def start(index: int, block: dict[str, Any]) -> bytes:
        return named({"type": "content_block_start", "content_block": block, "index": index})

    def delta(index: int, **fields: str) -> bytes:
        return named({"type": "content_block_delta", "delta": fields, "index": index})

    def stop(index: int) -> bytes:
        return named({"type": "content_block_stop", "index": index})

    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    tool = {"type": "tool_use", "id": "call_1", "name": "weather", "input": {}}
    return [
        named({"type": "message_start", "message": message}),
        start(0, {"type": "thinking", "thinking": ""}),
        *(delta(0, type="thinking_delta", thinking=t) for t in thoughts),
        delta(0, type="signature_delta", signature="sig"),
        stop(0),
        start(1, {"type": "text", "text": ""}),
        delta(1, type="text_delta", text=text),
        stop(1),
        start(2, tool),
        *(delta(2, type="input_json_delta", partial_json=f) for f in fragments),
        stop(2),
        named({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}}),
        named({"type": "message_stop"}),
    ]


_AGENTS = {
    Dialect.CHAT: _agent_chat,
    Dialect.RESPONSES: _agent_responses,
    Dialect.MESSAGES: _agent_messages,
}


def agent_events(
    dialect: Dialect,
    thoughts: list[str] = THOUGHTS,
    text: str = "Sure.",
    fragments: list[str] = FRAGMENTS,
) -> list[bytes]:
    """An agent's turn in `dialect` as vLLM 0.32 streams it with a reasoning and a tool
    parser: a reasoning phase (`thoughts`), a short answer (`text`), then one function
    call whose arguments come in `fragments` (completions has no tools or reasoning).
    Chat: the role chunk, `delta.reasoning`, `delta.content`, the call's header and its
    `arguments` deltas, the `tool_calls` finish chunk, usage, `[DONE]`. Responses: a
    reasoning item, a message item and a function_call item, each opened and closed by
    `output_item.added`/`done`, then `response.completed`. Messages: a thinking block
    (with its `signature_delta`), a text block and a tool_use block, then `message_delta`
    with `stop_reason: tool_use` and `message_stop`."""
    return _AGENTS[dialect](thoughts, text, fragments)


_WRITERS = {
    Dialect.CHAT: _chat,
    Dialect.COMPLETIONS: _completions,
    Dialect.RESPONSES: _responses,
    Dialect.MESSAGES: _messages,
}


def answer_events(dialect: Dialect, pieces: list[str], end: str = "stop") -> list[bytes]:
    """The events of a stream carrying `pieces`, ended by `end` ("stop" or "length")."""
    return _WRITERS[dialect](pieces, end)


def request_bytes(dialect: Dialect) -> bytes:
    """A streaming request to the dialect's endpoint."""
    body = b'{"model":"m","stream":true}'
    return (
        f"POST {PATHS[dialect]} HTTP/1.1\r\nHost: up\r\n".encode()
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )
