"""What a streamed event means, one rule per API dialect (pure).

vLLM streams four APIs over SSE, and every reader of a stream (fault triggers, the scorer,
the journal's view, the timeline) asks this module what an event means instead of
parsing chunk JSON itself. `read(event, dialect)` returns a `Meaning`: whether the event
carries a token and of which kind (answer text, reasoning, tool-call arguments), the text
it adds, whether it ends the answer and how (complete, cut by a length limit, error,
cancelled), whether it is the stream's last event, and its resume position.

The dialects, as vLLM 0.32 writes them (measured with `curl -N` against the tier's server;
recordings in tests/core/streams/):

- `CHAT` (`POST /v1/chat/completions`) and `COMPLETIONS` (`POST /v1/completions`):
  data-only events `data: {"object": "chat.completion.chunk" | "text_completion",
  "choices": [...]}`, a first chat chunk with `delta.role` and `content: ""`, one chunk per
  engine step with `delta.content` / `delta.reasoning` (`reasoning_content` in older
  parsers) / `delta.tool_calls[].function.arguments`, or `text`; a choice's
  `finish_reason` (stop, length, tool_calls, abort, error) ends the answer, an optional usage
  chunk with `choices: []` follows, then `data: [DONE]`. A failed generation is one
  `data: {"error": {...}}` frame, then `[DONE]`. The resume position is the SSE `id:`
  field, which vLLM never sends (a proxy may add one).
- `RESPONSES` (`POST /v1/responses`; `GET /v1/responses/{id}?stream=true&starting_after=N`
  replays a background response from N+1): named events `event: <type>` whose data repeats
  `"type"` and carries `"sequence_number"` (the resume position). Text comes in
  `response.output_text.delta`, reasoning in `response.reasoning_text.delta`, a function
  call's arguments in `response.function_call_arguments.delta` (vLLM's
  `openai/responses/streaming_events.py`; the OpenAI SDK's `ResponseTextDeltaEvent`,
  `ResponseReasoningTextDeltaEvent`, `ResponseFunctionCallArgumentsDeltaEvent`). There is no
  `[DONE]`: the stream ends with `response.completed`, whose `response.status` says how the
  answer ended; vLLM writes a response cut by `max_output_tokens` as `response.completed`
  with `status: "incomplete"` and `incomplete_details.reason: "max_output_tokens"`, a
  cancelled background response as `status: "cancelled"`, and a failed generation as an
  `error` event. `response.incomplete` and `response.failed` (OpenAI's own) read the same.
- `MESSAGES` (`POST /v1/messages`, Anthropic's API; vLLM's `entrypoints/anthropic/serving.py`):
  named events `message_start`, `content_block_start`, `content_block_delta` (`text_delta`,
  `thinking_delta`, `input_json_delta`, `signature_delta`), `content_block_stop`,
  `message_delta` whose `delta.stop_reason` ends the answer (end_turn, stop_sequence,
  tool_use: complete; max_tokens: length), `message_stop` (the last event), `ping`, and
  `event: error`. No resume position beyond an SSE `id:`.

The rule for a token, the same in every dialect: **an event carries a token when it adds
non-empty text to the answer, the reasoning or a tool call's arguments.** Two choices:

- A step whose text is empty is not a token. vLLM's chat and completions streams send one
  chunk per engine step, so a step whose bytes the detokenizer holds back (half of a
  multi-byte character) is a chunk with `content: ""`; its Responses and Messages streams
  drop those steps (`resolve_target_state` returns NONE for empty content; the Anthropic
  converter passes on `content == ""`): a 4-token answer measured as 4 chat chunks and 2
  `output_text.delta` events. Counting only text-adding events makes "after 12 tokens"
  land after the same piece of the same answer in all four dialects. For the same reason
  the role chunk, a tool call's header (its name, `arguments: ""`) and a final chunk with
  `content: ""` and the `finish_reason` carry no token.
- Reasoning is a token (kind `REASONING`): vLLM generates it and streams it like the answer,
  so a trigger counting tokens, and the scorer timing them, count the thinking too. A chunk
  that carries both answer and reasoning text counts once, as the answer.

The dialect comes from the request when it was seen (`dialect_for(method, target)`);
otherwise each event names its own (`detect`): a `response.*` type or an event with a
`sequence_number` is Responses, an Anthropic event type is Messages, a `text_completion`
chunk or a choice with `text` is completions, anything else chat.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from middlebox.core.sse import SseEvent


class Dialect(enum.Enum):
    """One streaming API."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    MESSAGES = "messages"


class TokenKind(enum.Enum):
    """What a token adds to."""

    ANSWER = "answer"
    REASONING = "reasoning"
    TOOL_ARGUMENTS = "tool_arguments"


class EndKind(enum.Enum):
    """How an answer ended, in the API's own terms mapped to four."""

    COMPLETE = "complete"  # the model stopped: stop, tool_calls, end_turn, tool_use, completed
    LENGTH = "length"  # cut by max_tokens / max_output_tokens
    ERROR = "error"  # an in-band error or a failed response
    CANCELLED = "cancelled"  # aborted or cancelled (vLLM's `abort`, Responses' `cancelled`)


@dataclass(frozen=True, slots=True)
class Meaning:
    """What one event says. `token`/`text`: the token it carries and the text it adds
    (None/"" when none; `text` is that kind's text). `tool_fragments`: the non-empty
    tool-call argument pieces in it (a chat chunk may carry several calls). `end`: how the
    answer ended, when this event says so; `reason` the API's own word for it
    (`finish_reason`, `stop_reason`, `incomplete_details.reason` or the response's
    status; "error" for an error event). `last`: the stream's closing event (`[DONE]`,
    `message_stop`, a terminal Responses event, an error where nothing follows).
    `sequence`: a Responses `sequence_number`; `event_id`: the SSE `id:` this event set.
    `choice`: the chat/completions choice the event is about (0 elsewhere)."""

    dialect: Dialect
    token: TokenKind | None = None
    text: str = ""
    tool_fragments: int = 0
    end: EndKind | None = None
    reason: str | None = None
    last: bool = False
    sequence: int | None = None
    event_id: str | None = None
    choice: int = 0

    @property
    def position(self) -> str | None:
        """Where a client resumes after this event: the Responses `sequence_number`
        (`starting_after`), else the SSE `id:` (`Last-Event-ID`)."""
        return str(self.sequence) if self.sequence is not None else self.event_id


# -- which dialect ------------------------------------------------------------------------

_RETRIEVE = re.compile(r"/responses/[^/]+$")


def dialect_for(method: str, target: str) -> Dialect | None:
    """The dialect of the stream that answers a request, from its method and target (path
    and query; a prefix before `/v1` is allowed, as gateways mount it); None when the path
    names no streaming API. A `GET /v1/responses/{id}` with `stream=true` streams a stored
    background response, with `starting_after=N` from event N+1."""
    path = urlsplit(target).path.rstrip("/")
    method = method.upper()
    if method == "POST":
        if path.endswith("/chat/completions"):
            return Dialect.CHAT
        if path.endswith("/completions"):
            return Dialect.COMPLETIONS
        if path.endswith("/responses"):
            return Dialect.RESPONSES
        if path.endswith("/messages"):
            return Dialect.MESSAGES
    if method == "GET" and _RETRIEVE.search(path):
        return Dialect.RESPONSES
    return None


def starting_after(method: str, target: str) -> int | None:
    """The `starting_after=N` of a Responses replay (`GET /v1/responses/{id}?stream=true`):
    its first event is N+1; None for any other request, or a value that is no integer."""
    if dialect_for(method, target) is not Dialect.RESPONSES or method.upper() != "GET":
        return None
    values = parse_qs(urlsplit(target).query).get("starting_after", [])
    try:
        return int(values[-1]) if values else None
    except ValueError:
        return None


_MESSAGES_TYPES = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
    }
)


def json_payload(event: SseEvent) -> dict[str, Any] | None:
    """The event's data as a JSON object, or None (`[DONE]`, junk, arrays...)."""
    if not event.data.startswith("{"):
        return None
    try:
        payload = json.loads(event.data)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def detect(event: SseEvent, payload: dict[str, Any] | None = None) -> Dialect:
    """The dialect an event shows by its own shape (for a stream whose request was not
    seen): its SSE event name or its data's `type`, else its chunk's `object` or choices."""
    if payload is None:
        payload = json_payload(event)
    kind = payload.get("type") if payload is not None else None
    names = {event.event, kind if isinstance(kind, str) else ""}
    if any(name.startswith("response.") for name in names) or (
        payload is not None and "sequence_number" in payload
    ):
        return Dialect.RESPONSES
    if names & _MESSAGES_TYPES or "error" in names:
        return Dialect.MESSAGES
    if payload is not None:
        if payload.get("object") == "text_completion":
            return Dialect.COMPLETIONS
        choices = payload.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        if isinstance(first, dict) and "text" in first and "delta" not in first:
            return Dialect.COMPLETIONS
    return Dialect.CHAT


# -- reading an event ---------------------------------------------------------------------


def read(event: SseEvent, dialect: Dialect | None = None) -> Meaning:
    """What `event` means in `dialect` (by its own shape when None)."""
    payload = json_payload(event)
    if dialect is None:
        dialect = detect(event, payload)
    if dialect is Dialect.RESPONSES:
        meaning = _responses(payload)
    elif dialect is Dialect.MESSAGES:
        meaning = _messages(event, payload)
    else:
        meaning = _choices(dialect, event, payload)
    return meaning if event.id is None else replace(meaning, event_id=event.id)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _token(pieces: list[tuple[TokenKind, str]]) -> tuple[TokenKind | None, str]:
    """The token among an event's pieces: the first with text, answer before reasoning
    when one chunk carries both (module docstring)."""
    for kind, text in pieces:
        if text:
            return kind, text
    return None, ""


_FINISH_ENDS = {
    "length": EndKind.LENGTH,
    "error": EndKind.ERROR,
    "abort": EndKind.CANCELLED,
}


def _choices(dialect: Dialect, event: SseEvent, payload: dict[str, Any] | None) -> Meaning:
    """A chat or completions event: `[DONE]`, an error frame, or a chunk of choices. vLLM
    sends one choice per chunk (n>1 included); a chunk with several reads as its first
    choice that carries a token, else its first that ends, else its first."""
    if event.is_done:
        return Meaning(dialect, last=True)
    if payload is None:
        return Meaning(dialect)
    if "error" in payload:
        return Meaning(dialect, end=EndKind.ERROR, reason="error")
    choices = payload.get("choices")
    found = (
        [_choice(dialect, c) for c in choices if isinstance(c, dict)]
        if isinstance(choices, list)
        else []
    )
    if not found:
        return Meaning(dialect)  # a usage chunk, or something that is no chunk
    chosen = next((m for m in found if m.token is not None), None)
    chosen = chosen or next((m for m in found if m.end is not None), found[0])
    return replace(chosen, tool_fragments=sum(m.tool_fragments for m in found))


def _choice(dialect: Dialect, choice: dict[str, Any]) -> Meaning:
    """One choice of a chat chunk (`delta`) or a completions chunk (`text`)."""
    pieces: list[tuple[TokenKind, str]] = []
    fragments = 0
    delta = choice.get("delta")
    if isinstance(delta, dict):
        calls = delta.get("tool_calls")
        arguments = []
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            part = _text(function.get("arguments")) if isinstance(function, dict) else ""
            fragments += bool(part)
            arguments.append(part)
        pieces += [(TokenKind.TOOL_ARGUMENTS, "".join(arguments))]
        pieces += [(TokenKind.ANSWER, _text(delta.get("content")))]
        reasoning = _text(delta.get("reasoning")) or _text(delta.get("reasoning_content"))
        pieces += [(TokenKind.REASONING, reasoning)]
    else:
        pieces += [(TokenKind.ANSWER, _text(choice.get("text")))]
    token, text = _token(pieces)
    finish = choice.get("finish_reason")
    end = _FINISH_ENDS.get(finish, EndKind.COMPLETE) if isinstance(finish, str) else None
    index = choice.get("index", 0)
    return Meaning(
        dialect,
        token,
        text,
        fragments,
        end,
        finish if isinstance(finish, str) else None,
        choice=index if isinstance(index, int) else 0,
    )


_RESPONSES_TOKENS = {
    "response.output_text.delta": TokenKind.ANSWER,
    "response.refusal.delta": TokenKind.ANSWER,
    "response.reasoning_text.delta": TokenKind.REASONING,
    "response.reasoning_summary_text.delta": TokenKind.REASONING,
    "response.function_call_arguments.delta": TokenKind.TOOL_ARGUMENTS,
    "response.custom_tool_call_input.delta": TokenKind.TOOL_ARGUMENTS,
    "response.mcp_call_arguments.delta": TokenKind.TOOL_ARGUMENTS,
}
_RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_STATUS_ENDS = {
    "completed": EndKind.COMPLETE,
    "failed": EndKind.ERROR,
    "cancelled": EndKind.CANCELLED,
}
_LENGTH_REASONS = frozenset({"max_output_tokens", "max_tokens"})


def _responses(payload: dict[str, Any] | None) -> Meaning:
    """A Responses event, by its data's `type` (the `event:` name repeats it)."""
    if payload is None:
        return Meaning(Dialect.RESPONSES)
    kind = payload.get("type")
    number = payload.get("sequence_number")
    sequence = number if isinstance(number, int) and not isinstance(number, bool) else None
    token = _RESPONSES_TOKENS.get(kind) if isinstance(kind, str) else None
    if token is not None:
        text = _text(payload.get("delta"))
        fragments = int(bool(text)) if token is TokenKind.TOOL_ARGUMENTS else 0
        return Meaning(
            Dialect.RESPONSES, token if text else None, text, fragments, sequence=sequence
        )
    if kind == "error":
        error = EndKind.ERROR
        return Meaning(Dialect.RESPONSES, end=error, reason="error", last=True, sequence=sequence)
    if kind not in _RESPONSES_TERMINAL:
        return Meaning(Dialect.RESPONSES, sequence=sequence)
    response = payload.get("response")
    status = response.get("status") if isinstance(response, dict) else None
    details = response.get("incomplete_details") if isinstance(response, dict) else None
    why = details.get("reason") if isinstance(details, dict) else None
    if status == "incomplete":
        # Only a token limit is a length cut; OpenAI's other reason (content_filter) is not
        # the answer the model meant either, so it reads as an error.
        end = EndKind.LENGTH if why in _LENGTH_REASONS else EndKind.ERROR
        reason = why if isinstance(why, str) else "incomplete"
    else:
        default = EndKind.ERROR if kind == "response.failed" else EndKind.COMPLETE
        end = _STATUS_ENDS.get(status, default) if isinstance(status, str) else default
        reason = status if isinstance(status, str) else kind.removeprefix("response.")
    return Meaning(Dialect.RESPONSES, end=end, reason=reason, last=True, sequence=sequence)


_MESSAGES_DELTAS = {
    "text_delta": (TokenKind.ANSWER, "text"),
    "thinking_delta": (TokenKind.REASONING, "thinking"),
    "input_json_delta": (TokenKind.TOOL_ARGUMENTS, "partial_json"),
}
_STOP_ENDS = {
    "max_tokens": EndKind.LENGTH,
    "model_context_window_exceeded": EndKind.LENGTH,
}


def _messages(event: SseEvent, payload: dict[str, Any] | None) -> Meaning:
    """An Anthropic Messages event, by its data's `type` (or its `event:` name)."""
    if payload is None:
        return Meaning(Dialect.MESSAGES)
    kind = payload.get("type", event.event)
    delta = payload.get("delta")
    if kind == "content_block_delta" and isinstance(delta, dict):
        found = _MESSAGES_DELTAS.get(delta.get("type"))  # type: ignore[arg-type]
        if found is None:
            return Meaning(Dialect.MESSAGES)  # signature_delta, citations_delta
        token, field = found
        text = _text(delta.get(field))
        fragments = int(bool(text)) if token is TokenKind.TOOL_ARGUMENTS else 0
        return Meaning(Dialect.MESSAGES, token if text else None, text, fragments)
    if kind == "message_delta" and isinstance(delta, dict):
        stop = delta.get("stop_reason")
        if isinstance(stop, str):
            end = _STOP_ENDS.get(stop, EndKind.COMPLETE)
            return Meaning(Dialect.MESSAGES, end=end, reason=stop)
        return Meaning(Dialect.MESSAGES)
    if kind == "message_stop":
        return Meaning(Dialect.MESSAGES, last=True)
    if kind == "error":
        return Meaning(Dialect.MESSAGES, end=EndKind.ERROR, reason="error", last=True)
    return Meaning(Dialect.MESSAGES)


NATURAL_STOPS = frozenset({"stop", "end_turn", "stop_sequence", "completed"})
"""The reasons an answer gives when the model itself stopped (not a tool call): chat's and
completions' `stop`, Messages' `end_turn` / `stop_sequence`, a Responses `completed`."""


def end_of_reason(reason: str | None) -> EndKind | None:
    """How an answer ended, from the reason word a client or a leg reports in its API's
    terms (a `finish_reason`, a `stop_reason`, a response's status or its
    `incomplete_details.reason`): the same four ends `read` gives events."""
    if reason is None:
        return None
    if reason in NATURAL_STOPS or reason in ("tool_calls", "tool_use", "pause_turn"):
        return EndKind.COMPLETE
    if reason in _LENGTH_REASONS or reason in ("length", "model_context_window_exceeded"):
        return EndKind.LENGTH
    if reason in ("abort", "cancelled"):
        return EndKind.CANCELLED
    return EndKind.ERROR if reason in ("error", "failed", "refusal", "incomplete") else None
