"""request_timeouts on a framed path: it reads the path's one framing pass
(frame once) instead of running framers of its own, and times every request exactly as
it does alone, on the same literal timelines."""

from __future__ import annotations

import pytest

from faults._proxy.request_timeouts import RequestTimeouts, request_timeout_answer
from faults.sse_ids import SseIds
from faults.testing import TimedItem, replay
from middlebox.core.fault import Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item

GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
POST_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"

TIMELINES: dict[str, list[tuple[float, Item]]] = {
    "a slow second head": [
        (1.0, Chunk(UP, GET)),
        (2.0, Chunk(DOWN, OK)),
        (30.0, Chunk(UP, b"GET / HTTP/1.1\r\n")),
    ],
    "idle keep-alive": [
        (1.0, Chunk(UP, GET)),
        (3.5, Chunk(DOWN, OK[:20])),
        (4.0, Chunk(DOWN, OK[20:])),
    ],
    "a body gap": [(1.0, Chunk(UP, POST_HEAD + b"abc")), (30.0, Chunk(UP, b"de"))],
    "a drip then the answer": [
        (1.0, Chunk(UP, POST_HEAD)),
        *[(1.5 + i * 0.5, Chunk(UP, b"x")) for i in range(10)],
        (8.0, Chunk(DOWN, OK)),
    ],
    "a head split in three": [
        (1.0, Chunk(UP, GET[:5])),
        (2.0, Chunk(UP, GET[5:20])),
        (50.0, Chunk(UP, GET[20:])),
        (51.0, Chunk(DOWN, OK)),
    ],
    "not HTTP": [(1.0, Chunk(UP, b"\x16\x03\x01 hello")), (500.0, Chunk(DOWN, b"x"))],
}


def stage() -> RequestTimeouts:
    return RequestTimeouts(header_timeout=10.0, keepalive_timeout=75.0, body_timeout=20.0)


def ends_and_answers(out: list[TimedItem]) -> list[TimedItem]:
    """What the stage decides: the ends, and its own 408 (the rest passes as it came)."""
    return [
        (t, item)
        for t, item in out
        if not isinstance(item, Chunk) or item.data == request_timeout_answer()
    ]


@pytest.mark.parametrize("timeline", TIMELINES.values(), ids=list(TIMELINES))
def test_a_framed_path_times_every_request_as_the_stage_alone_does(
    timeline: list[tuple[float, Item]],
) -> None:
    alone = stage()
    expected = ends_and_answers(replay(alone, timeline, until=1000.0))
    framed_stage = stage()
    pipeline = Pipeline([framed_stage, SseIds()])
    got = ends_and_answers(replay(pipeline, timeline, until=1000.0))
    assert got == expected
    # it read the path's one pass: the path's request framer, readers, no framer of its own
    assert pipeline.framing is not None
    assert framed_stage._requests is pipeline.framing.up_at[0].http
    assert framed_stage._request_reader is not None
    assert framed_stage._response_reader is not None
    assert framed_stage._responses.offset == 0  # its own response framer never fed
    assert [r.details for r in framed_stage.reports] == [r.details for r in alone.reports]


def test_alone_it_frames_for_itself_and_a_framed_path_holds_no_pieces_for_it_after() -> None:
    timeline: list[tuple[float, Item]] = [(1.0, Chunk(UP, b"\x16\x03\x01 tls\r\n\r\n"))]
    framed_stage = stage()
    pipeline = Pipeline([framed_stage, SseIds()])
    replay(pipeline, timeline)
    assert framed_stage.finished
    assert pipeline.framing is not None
    assert framed_stage._request_reader not in pipeline.framing.up_at[0]._readers
    assert replay(stage(), [(1.0, Chunk(UP, GET)), (2.0, Eof(UP))])[-1][1] == Eof(UP)
