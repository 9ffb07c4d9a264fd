"""http_error steps aside for the server's response bodies (`Fault.body_aside`): the
pipeline passes it over for reads that are all body, keeping its place in the response
stream and its count of the server's bytes, so an answer waiting behind a forwarded
response still goes out right at that response's end, and the stream after it (framed
from its output) carries the same pieces. Compared with the fault given every item."""

from __future__ import annotations

import random

from faults._lib.match import RequestMatch
from faults.http_error import HttpError
from faults.set_header import SetHeader
from middlebox.core.fault import FaultContext, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item
from tests.faults.httpprops import SSE_HEAD, counting, request, spread_splits, sse_chunks

LENGTH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n"


def run(reads: list[bytes], aside: bool, connection: str) -> tuple[object, ...]:
    """Three pipelined requests, the second answered by http_error; the server answers the
    first and the third. Returns the bytes out, the client leg's pieces and the reports,
    and how many response items http_error was given."""
    fault = HttpError(status=429, connection=connection, match=RequestMatch(requests=[1]))
    # set_header nearer the client reads the stream framed from http_error's output
    pipeline = Pipeline([SetHeader(), fault])
    pipeline.bind(FaultContext(rng=random.Random(0)))
    if not aside:
        fault.body_aside = None
    framing = pipeline.framing
    assert framing is not None
    pieces: list[object] = []
    framing.leg("client")[1].listen(
        lambda e: pieces.append((e.piece.kind, e.piece.message, e.piece.offset, e.piece.data))
    )
    given = counting(fault)
    out: list[Item] = list(pipeline.on_open(0.0))
    out += pipeline.on_item(Chunk(UP, request() + request() + request()), 0.0)
    for step, data in enumerate(reads):
        out += pipeline.on_item(Chunk(DOWN, data), 0.1 + step / 100)
    out += pipeline.on_item(Eof(DOWN), 1.0)
    sent = b"".join(i.data for i in out if isinstance(i, Chunk) and i.direction is DOWN)
    reports = [(r.action, r.details) for r in fault.reports]
    return sent, pieces, reports, sum(i.direction is DOWN for i in given)


def test_passed_over_or_given_every_item_the_answers_go_out_at_the_same_byte() -> None:
    body = sse_chunks(2)
    wire = SSE_HEAD + b"".join(body) + LENGTH_HEAD + b"hello, world"
    per_chunk = [SSE_HEAD, *body, LENGTH_HEAD, b"hello", b", world"]
    splits = [per_chunk, *spread_splits(wire)]
    for connection in ("keep-alive", "close"):
        for reads in splits:
            passed = run(reads, aside=True, connection=connection)
            assert passed[:3] == run(reads, aside=False, connection=connection)[:3], reads
            sent = passed[0]
            assert isinstance(sent, bytes)
            # the 429 goes out right after the first response's last chunk
            answer_at = sent.index(b"HTTP/1.1 429")
            assert sent[:answer_at].endswith(b"0\r\n\r\n")
            assert (b"hello, world" in sent) is (connection == "keep-alive")
    # one read per chunk: the three body chunks before the last one and "hello" pass it by
    assert run(per_chunk, aside=True, connection="keep-alive")[3] == len(per_chunk) + 1 - 4
    assert run(per_chunk, aside=False, connection="keep-alive")[3] == len(per_chunk) + 1
