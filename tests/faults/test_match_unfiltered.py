"""A match with no filter (no method, path or model) decides without reading the request
(`RequestMatch.take`): no `RequestInfo` is made, only that the request's head arrived
counts. It must decide as a match whose filters accept every request does (`path: "*"`):
the same requests chosen, the same cross-connection counts, the same coins drawn, the
same bytes and reports, and still nothing for a response whose request never came."""

from __future__ import annotations

import random

import pytest

from faults._lib.match import RequestMatch
from faults.idle_reaper import IdleReaper
from faults.set_header import SetHeader
from faults.testing import TimedItem, replay
from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.httpprops import SSE_HEAD, request, sse_chunks

LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def timeline() -> list[TimedItem]:
    """Keep-alive exchanges, a request split across reads, two pipelined in one read."""
    post = request()
    get = request(method="GET", path="/v1/models")
    out: list[TimedItem] = [
        (0.0, Chunk(UP, post)),
        (0.5, Chunk(DOWN, SSE_HEAD + b"".join(sse_chunks(2)))),
        (1.0, Chunk(UP, get[:7])),
        (1.1, Chunk(UP, get[7:])),
        (1.5, Chunk(DOWN, LENGTH)),
        (2.0, Chunk(UP, post + get)),
        (2.5, Chunk(DOWN, LENGTH + LENGTH)),
    ]
    out += [(3.0 + i, Chunk(UP, get)) for i in range(4)]
    out += [(3.5 + i, Chunk(DOWN, LENGTH)) for i in range(4)]
    return [*out, (9.0, Eof(UP)), (9.0, Eof(DOWN))]


def run(make: type[Fault], match: RequestMatch, seed: int, shared: dict[str, object]) -> tuple:
    fault = make(match=match)  # type: ignore[call-arg]
    pipeline = Pipeline([fault])
    pipeline.bind(FaultContext(1, random.Random(seed), shared=shared))
    out = replay(pipeline, timeline(), bind=False)
    wire = [(t, type(item).__name__, getattr(item, "data", b"")) for t, item in out]
    reports = [(r.action, r.time, r.details) for r in fault.reports]
    return wire, reports, dict(shared)


@pytest.mark.parametrize("make", [SetHeader, IdleReaper])
@pytest.mark.parametrize(
    "options",
    [{}, {"first": 3}, {"every": 2}, {"requests": [1, 4]}, {"probability": 0.5}, {"after": 2.0}],
)
def test_an_unfiltered_match_decides_as_a_match_every_request_passes(
    make: type[Fault], options: dict[str, object]
) -> None:
    for seed in range(4):
        unfiltered = RequestMatch(**options)  # type: ignore[arg-type]
        accepting = RequestMatch(path="*", **options)  # type: ignore[arg-type]
        assert not unfiltered.filters and accepting.filters
        shared_a: dict[str, object] = {}
        shared_b: dict[str, object] = {}
        for _connection in range(2):  # counts carry across connections
            got = run(make, unfiltered, seed, shared_a)
            want = run(make, accepting, seed, shared_b)
            assert got == want
        if make is SetHeader and not options:
            assert len(got[1]) == 7  # every response but the one already carrying it


def test_a_response_without_its_request_is_not_decided_unfiltered() -> None:
    fault = SetHeader()
    pipeline = Pipeline([fault])
    pipeline.bind(FaultContext(1, random.Random(0)))
    out = replay(pipeline, [(0.0, Chunk(DOWN, LENGTH))], bind=False)
    assert b"".join(item.data for _, item in out if isinstance(item, Chunk)) == LENGTH
    assert fault.reports == [] and fault.decided(0) is False
