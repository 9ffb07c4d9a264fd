"""`PathFraming.between_messages`: the pure query graceful shutdown asks, so an
idle kept-alive connection is closed at once (nginx's `ngx_close_idle_connections`) while
a request in flight, a response still streaming or a pipelined next head is let finish."""

from __future__ import annotations

import random

from faults._lib.match import RequestMatch
from faults.http_error import HttpError
from faults.set_header import SetHeader
from faults.sse_ids import SseIds
from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.framed import PathFraming
from middlebox.core.stream import DOWN, UP, Chunk, Eof

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
EVENT = b"data: {}\n\n"
EVENT_CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
LAST = b"0\r\n\r\n"


def framing(*faults: Fault) -> tuple[Pipeline, PathFraming]:
    pipeline = Pipeline(list(faults) or [SseIds()])
    pipeline.bind(FaultContext(1, random.Random(0)))
    assert pipeline.framing is not None
    return pipeline, pipeline.framing


def test_a_fresh_connection_is_between_messages() -> None:
    _, path = framing()
    assert path.between_messages()


def test_each_step_of_one_exchange_says_whether_a_message_is_under_way() -> None:
    pipeline, path = framing()
    steps = [
        (UP, REQUEST[:10], False),  # a head arriving
        (UP, REQUEST[10:], False),  # the request is in, its answer is not
        (DOWN, SSE_HEAD, False),  # the response streams
        (DOWN, EVENT_CHUNK, False),
        (DOWN, LAST[:2], False),  # inside the last chunk
        (DOWN, LAST[2:], True),  # answered in full: idle, kept alive
        (UP, b"P", False),  # the next request's first byte
    ]
    for direction, data, idle in steps:
        pipeline.on_item(Chunk(direction, data), 0.0)
        assert path.between_messages() is idle, data


def test_a_pipelined_second_request_keeps_it_busy_after_the_first_answer() -> None:
    pipeline, path = framing()
    pipeline.on_item(Chunk(UP, REQUEST + REQUEST), 0.0)
    pipeline.on_item(Chunk(DOWN, SSE_HEAD + EVENT_CHUNK + LAST), 0.0)
    assert not path.between_messages()
    pipeline.on_item(Chunk(DOWN, SSE_HEAD + LAST), 0.0)
    assert path.between_messages()


def test_a_request_answered_by_a_fault_is_idle_once_its_answer_is_framed() -> None:
    rate_limit = HttpError(status=429, match=RequestMatch(path="/v1/chat/completions"))
    pipeline, path = framing(rate_limit)
    pipeline.on_item(Chunk(UP, REQUEST), 0.0)
    # the fault answered on the client leg; nothing went upstream
    assert path.between_messages()


def test_a_rewritten_response_is_judged_on_both_legs() -> None:
    pipeline, path = framing(SetHeader(headers={"X-Hop": "1"}, direction="response"), SseIds())
    pipeline.on_item(Chunk(UP, REQUEST), 0.0)
    pipeline.on_item(Chunk(DOWN, SSE_HEAD + EVENT_CHUNK), 0.0)
    assert not path.between_messages()
    pipeline.on_item(Chunk(DOWN, LAST), 0.0)
    assert path.between_messages()


def test_a_tunnel_or_unframeable_bytes_are_never_idle() -> None:
    pipeline, path = framing()
    pipeline.on_item(
        Chunk(UP, b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"), 0.0
    )
    pipeline.on_item(
        Chunk(DOWN, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"), 0.0
    )
    assert not path.between_messages()
    other, other_path = framing()
    other.on_item(Chunk(UP, b"GET  / HTTP/1.1\r\n\r\n"), 0.0)
    assert not other_path.between_messages()


def test_an_upstream_close_mid_response_is_not_idle() -> None:
    pipeline, path = framing()
    pipeline.on_item(Chunk(UP, REQUEST), 0.0)
    pipeline.on_item(Chunk(DOWN, SSE_HEAD + EVENT_CHUNK), 0.0)
    pipeline.on_item(Eof(DOWN), 0.0)
    assert not path.between_messages()
