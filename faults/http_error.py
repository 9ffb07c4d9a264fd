"""http_error: answer matched requests with an error status before the stream starts.

Imitates a hop that answers by itself, so the request never reaches the server:
- `openai`: OpenAI's API edge (Cloudflare in front): a 429 `rate_limit_exceeded` body
  (`{"error": {"message": "Rate limit reached for ...", "type": "requests", "param":
  null, "code": "rate_limit_exceeded"}}`, pretty-printed), 500 `server_error`, 503
  "The engine is currently overloaded";
- `vllm`: vLLM's own pre-stream errors (reference §2.1): a 503 when
  `--max-num-queued-reqs` overflows (`QueueOverflowError`, checked before streaming),
  500 `InternalServerError`, 404 for an unknown model, compact JSON `{"error":
  {"message", "type", "param", "code"}}` with `code` equal to the status;
- `nginx`: an nginx error page (`limit_req` answers 503 by default, `limit_req_status
  429`; 502/504 when the upstream fails);
- `text`: a plain-text answer as a load balancer's local reply.

`Retry-After` is sent as delay-seconds, an integer (RFC 9110 §10.2.3), rounded up.
With `connection: keep-alive` the connection stays usable and later requests go to
the server; with `close` (or when the request asked for `Connection: close`) the
answer carries `Connection: close`, the client side gets a FIN after it and the
server side a FIN (once the server has finished the responses it still owes), and
the client's further bytes are dropped. Answers keep HTTP/1.1's order: one for a
request behind a forwarded one waits until the server's response to that is done.
When the server closes (or resets) first, an answer still waiting is not sent: the
response ahead of it then either never came, or was cut short, or was one whose body the
close itself delimits (no Content-Length, not chunked: RFC 9112 §6.3), so bytes after it
would be read as part of it, or as the answer to the forwarded request. The client gets
the close and retries what went unanswered (RFC 9112 §9.3.2), as behind nginx, which
closes after a response it cannot keep alive and leaves pipelined requests unanswered.
Each such answer is reported `unsent`.

The server's bytes it forwards decide nothing inside a response's body (an answer waits for
the response's end), so it steps aside for response bodies (`Fault.body_aside`): the
pipeline keeps its place in the response stream and its count of the server's bytes.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import ClassVar, Literal

from faults._lib.checks import check_choice
from faults._lib.items import joined_chunk
from faults._lib.match import HttpMatched, RequestInfo
from middlebox.core.fault import Fault, FaultContext, Seconds
from middlebox.core.framed import BodyPass, BodyRun, Framed
from middlebox.core.http1 import PieceKind
from middlebox.core.responses import error_response, nginx_error_page
from middlebox.core.stream import Chunk, Direction, Eof, Item, Reset

__all__ = ["HttpError", "error_body"]

BodyShape = Literal["openai", "vllm", "nginx", "text"]
ConnectionMode = Literal["keep-alive", "close"]

# OpenAI's documented error types and codes (platform.openai.com/docs/guides/error-codes):
# status -> (type, code, message template).
_OPENAI: dict[int, tuple[str, str | None, str]] = {
    401: (
        "invalid_request_error",
        "invalid_api_key",
        "Incorrect API key provided. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
    ),
    404: (
        "invalid_request_error",
        "model_not_found",
        "The model `{model}` does not exist or you do not have access to it.",
    ),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for {model} in organization org-middlebox on requests per min "
        "(RPM): Limit 60, Used 60, Requested 1. Please try again in {wait}. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
    ),
    500: (
        "server_error",
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
    503: ("server_error", None, "The engine is currently overloaded, please try again later"),
}

# vLLM 0.33 `create_error_response` (reference §2.1): status -> (type, param, message).
_VLLM: dict[int, tuple[str, str | None, str]] = {
    400: ("BadRequestError", None, "Bad Request"),
    404: ("NotFoundError", "model", "The model `{model}` does not exist."),
    422: ("UnprocessableEntityError", None, "Unprocessable Entity"),
    500: ("InternalServerError", None, "The server had an error while processing your request."),
    501: ("NotImplementedError", None, "Not Implemented"),
    503: (
        "Service Unavailable",
        None,
        "The engine is currently busy and cannot accept new requests. Please try again "
        "later or on a different instance.",
    ),
}

_SERVER: dict[str, str | None] = {
    "openai": "cloudflare",
    "vllm": "uvicorn",
    "nginx": "nginx",
    "text": None,
}


def error_body(
    shape: BodyShape,
    status: int,
    message: str | None = None,
    model: str | None = None,
    retry_after: float | None = None,
) -> tuple[bytes, str]:
    """The body and Content-Type a `shape` server sends with `status`."""
    phrase = HTTPStatus(status).phrase
    error: dict[str, str | int | None]
    fill = {"model": model or "default", "wait": f"{retry_after or 1:g}s"}
    if shape == "openai":
        kind, code, template = _OPENAI.get(
            status, ("server_error" if status >= 500 else "invalid_request_error", None, phrase)
        )
        error = {
            "message": message or template.format(**fill),
            "type": kind,
            "param": None,
            "code": code,
        }
        return json.dumps({"error": error}, indent=4).encode() + b"\n", "application/json"
    if shape == "vllm":
        if status == 401 and message is None:
            # The --api-key middleware answers with a plain string (reference §2.1).
            return b'{"error":"Unauthorized"}', "application/json"
        kind, param, template = _VLLM.get(status, (phrase, None, phrase))
        error = {
            "message": message or template.format(**fill),
            "type": kind,
            "param": param,
            "code": status,
        }
        # Starlette's JSONResponse: compact separators, non-ASCII kept as UTF-8.
        text = json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":"))
        return text.encode(), "application/json"
    if shape == "nginx":
        return (nginx_error_page(status) if message is None else message.encode()), "text/html"
    return (message or phrase).encode(), "text/plain; charset=utf-8"


@dataclass
class HttpError(HttpMatched, Fault):
    """Answer matched requests with `status` (and `Retry-After`) in a `body` shape."""

    name: ClassVar[str] = "http_error"

    status: int = 429
    retry_after: Seconds | None = None
    body: BodyShape = "openai"
    message: str | None = None
    connection: ConnectionMode = "keep-alive"

    # Server responses still owed (None) and our answers waiting behind them (the answer,
    # whether it closes, the request's index).
    _queue: deque[tuple[bytes, bool, int] | None] = field(
        init=False, repr=False, compare=False, default_factory=deque
    )
    _down_offset: int = field(init=False, repr=False, compare=False, default=0)
    _client_done: bool = field(init=False, repr=False, compare=False, default=False)
    _down_closed: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        if not 400 <= self.status <= 599 or self.status not in HTTPStatus._value2member_map_:
            raise ValueError(f"status must be an HTTP error status (400-599), got {self.status!r}")
        if self.retry_after is not None and self.retry_after < 0:
            raise ValueError(f"retry_after must be >= 0, got {self.retry_after!r}")
        check_choice("body", self.body, BodyShape)
        check_choice("connection", self.connection, ConnectionMode)

    def answer(self, request: RequestInfo | None, close: bool) -> bytes:
        """The whole response sent for a matched request (the head alone for a HEAD
        request, whose response never has a body: RFC 9110 §9.3.2)."""
        model = request.model if request is not None else None
        payload, content_type = error_body(
            self.body, self.status, self.message, model, self.retry_after
        )
        extra = []
        if self.retry_after is not None:
            extra.append(("Retry-After", str(math.ceil(self.retry_after))))
        response = error_response(
            self.status,
            payload,
            content_type=content_type,
            extra_headers=extra,
            server=_SERVER[self.body],
            connection="close" if close else None,
        )
        if request is not None and request.method == "HEAD":
            return response[: len(response) - len(payload)]
        return response

    def changes(self) -> frozenset[Direction]:
        # Answered requests are swallowed, and their answers written toward the client.
        return frozenset(Direction)

    def bind(self, context: FaultContext) -> None:
        super().bind(context)
        if self._flow.own:
            # On its own the flow frames the server's responses too; they answer only the
            # requests forwarded (below), not every request the client sent.
            self._flow.position.up.responses_to.clear()
        else:
            self.body_aside = _ServerBody(self)

    def on_item(self, item: Item, now: float) -> list[Item]:
        if item.direction is Direction.UPSTREAM:
            return self._from_client(item, now)
        return self._from_server(item, now)

    def _from_client(self, item: Item, now: float) -> list[Item]:
        if self._client_done:
            # We are closing this connection: the client's later bytes go nowhere, but
            # its RST still aborts the server side.
            return [item] if isinstance(item, Reset) else []
        forward: list[bytes] = []
        for piece in self.gate(self.observe(item, now)):
            if self._client_done:
                break
            index = self.selected(piece.message)
            if piece.kind is PieceKind.OPAQUE or index is None:
                forward.append(piece.data)
                if piece.head is not None and piece.head.method is not None:
                    responses = self._flow.position.down.http
                    if self._flow.own and responses is not None:
                        responses.expect_response_to(piece.head.method)
                    self._queue.append(None)
                continue
            if piece.head is None:
                continue  # the body of a request we answered: swallowed
            close = self.connection == "close" or not piece.head.keep_alive
            self.report(
                now,
                "answered",
                request=index,
                message=piece.message,
                offset=piece.offset,
                status=self.status,
                connection="close" if close else "keep-alive",
            )
            answer = self.answer(self.request(piece.message), close)
            self._queue.append((answer, close, index))
            self._client_done = close
        out = joined_chunk(Direction.UPSTREAM, forward) + self._flush()
        if not isinstance(item, Chunk) and not self._client_done:
            out.append(item)
        return out

    def _from_server(self, item: Item, now: float) -> list[Item]:
        if self._down_closed:
            return []
        # The server's bytes pass as they arrive; the framer only says where a response
        # ends, so an answer waiting behind it can go out right there.
        data = item.data if isinstance(item, Chunk) else b""
        start = self._down_offset
        self._down_offset += len(data)
        # The server's side of this fault is a stream of its own (it swallows requests),
        # framed once for the path; on its own, the flow frames it here.
        reader = self._flow.responses
        if isinstance(item, Chunk):
            if self._flow.own:
                reader.stream.feed(data)
            framed = reader.advance(len(data))
        else:
            if self._flow.own:
                reader.stream.feed_eof()
            framed = reader.end()
        pieces = [entry.piece for entry in framed]
        out: list[Item] = []
        sent = 0
        # A response the server's end ends (a close-delimited body) is no place to answer
        # after: nothing is flushed behind it (below).
        for piece in pieces if isinstance(item, Chunk) else ():
            if piece.end_of_message and self._queue and self._queue[0] is None:
                self._queue.popleft()
                if self._queue and self._queue[0] is not None:
                    cut = piece.offset + len(piece.data) - start
                    out += joined_chunk(Direction.DOWNSTREAM, [data[sent:cut]]) + self._flush()
                    sent = cut
                    if self._down_closed:
                        return out
        out += joined_chunk(Direction.DOWNSTREAM, [data[sent:]])
        if not isinstance(item, Chunk):
            # The server ended with a response still owed, cut short or delimited by this
            # very close: the answers behind it cannot be told from its bytes (above).
            for entry in self._queue:
                if entry is not None:
                    self.report(
                        now,
                        "unsent",
                        request=entry[2],
                        status=self.status,
                        reason="the server closed before the response ahead of it ended",
                    )
            self._queue.clear()
            if not self._down_closed:
                out.append(item)
                self._down_closed = True
                self.body_aside = None  # it swallows the server's bytes from now on
        return out

    def _flush(self) -> list[Item]:
        """Send the answers at the front of the queue (HTTP/1.1 keeps responses in order)."""
        out: list[Item] = []
        while self._queue and self._queue[0] is not None and not self._down_closed:
            entry = self._queue.popleft()
            assert entry is not None
            response, close, _ = entry
            out.append(Chunk(Direction.DOWNSTREAM, response))
            if close:
                out += [Eof(Direction.DOWNSTREAM), Eof(Direction.UPSTREAM)]
                self._down_closed = True
                self.body_aside = None  # it swallows the server's bytes from now on
                self._queue.clear()
        return out


class _ServerBody(BodyPass):
    """http_error's place in the server's response stream while the pipeline passes it
    over for a body: the bytes go on as they came, counted in its offset (where an
    answer waiting behind the response is cut in when the response ends)."""

    __slots__ = ("fault",)

    def __init__(self, fault: HttpError) -> None:
        super().__init__(Direction.DOWNSTREAM, fault._flow.responses, None)
        self.fault = fault

    def passed(self, framed: list[Framed], run: BodyRun, now: float) -> None:
        self.fault._down_offset += run.end - run.start
