"""A workload request in the Responses and Anthropic Messages APIs, and what their events mean.

The workload is written in OpenAI's chat (or completions) terms (`middlebox.scenario.workload`):
a client that speaks another API sends the same conversation in that API's own request, as
its user would: `messages` (or `prompt`) become the Responses `input`, `max_tokens` its
`max_output_tokens`; for Messages, system messages become `system` and `max_tokens` stays
(Anthropic requires it). The request's tag rides in the user's text, so the scorer finds
the request on the wire as it does for chat. Fields the API does not name (vLLM's
`ignore_eos`, `top_k`, `seed`) travel in the body through the SDK's `extra_body`;
`stream_options` is chat's own (both APIs report usage at their end) and is left out.

What an event means is read by `middlebox.core.dialects`, the rule the scorer and the faults
use, so a client's `finish_reason` is the API's own word for how the answer ended
(`completed`, `max_output_tokens`, `end_turn`, `max_tokens`), as the scorer reads it.
"""

from __future__ import annotations

import json
from typing import Any

from middlebox.clients.contract import RequestSpec
from middlebox.core.dialects import Dialect, Meaning, read
from middlebox.core.sse import SseFramer

DEFAULT_MAX_TOKENS = 1024
"""Anthropic's `max_tokens` is required; a workload without one gets this."""

# Chat fields the Responses call names itself (same meaning, same name).
_RESPONSES_NAMED = {"model", "temperature", "top_p", "user", "metadata"}
# Chat fields the Messages call names itself; `stop` becomes `stop_sequences`.
_MESSAGES_NAMED = {"model", "temperature", "top_p", "top_k", "metadata"}
# Fields each translation consumes (never sent as they are).
_CONSUMED = {"messages", "prompt", "max_tokens", "max_completion_tokens", "stream",
             "stream_options", "stop", "n"}  # fmt: skip


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_tokens") or body.get("max_completion_tokens")
    return value if isinstance(value, int) else None


def _extra(body: dict[str, Any], named: set[str]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in named | _CONSUMED}


def responses_request(spec: RequestSpec) -> dict[str, Any]:
    """Keyword arguments of `client.responses.create` for a workload request."""
    body = spec.body
    options: dict[str, Any] = {k: v for k, v in body.items() if k in _RESPONSES_NAMED}
    options["input"] = body["messages"] if spec.endpoint == "chat" else body["prompt"]
    if (limit := _max_tokens(body)) is not None:
        options["max_output_tokens"] = limit
    if extra := _extra(body, _RESPONSES_NAMED):
        options["extra_body"] = extra
    return options


def messages_request(spec: RequestSpec) -> dict[str, Any]:
    """Keyword arguments of `client.messages.stream` for a workload request."""
    body = spec.body
    options: dict[str, Any] = {k: v for k, v in body.items() if k in _MESSAGES_NAMED}
    if spec.endpoint == "chat":
        chat = body["messages"]
        system = [m["content"] for m in chat if m.get("role") in ("system", "developer")]
        options["messages"] = [
            {"role": m["role"], "content": m["content"]}
            for m in chat
            if m.get("role") not in ("system", "developer")
        ]
        if system:
            options["system"] = "\n\n".join(str(s) for s in system)
    else:
        options["messages"] = [{"role": "user", "content": body["prompt"]}]
    options["max_tokens"] = _max_tokens(body) or DEFAULT_MAX_TOKENS
    stop = body.get("stop")
    if stop:
        options["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if extra := _extra(body, _MESSAGES_NAMED):
        options["extra_body"] = extra
    return options


def root_url(base_url: str) -> str:
    """The server root the anthropic SDK wants (it appends `/v1/messages` itself):
    `http://host:port/v1` -> `http://host:port`."""
    return base_url.rstrip("/").removesuffix("/v1")


def meaning(kind: str, payload: dict[str, Any], dialect: Dialect) -> Meaning:
    """What one event means, an SDK's parsed event given back as its type and JSON data."""
    wire = f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()
    (event,) = [piece.event for piece in SseFramer().feed(wire) if piece.event is not None]
    return read(event, dialect)
