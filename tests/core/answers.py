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
