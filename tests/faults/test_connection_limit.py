"""connection_limit: beyond `limit` requests in flight at once, the next one waits its turn."""

from __future__ import annotations

import random
from typing import Any

import pytest

from faults.connection_limit import ConnectionLimit
from faults.testing import joined, replay
from middlebox.core.fault import FaultContext
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset

REQUEST = Chunk(UP, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b"e\r\ndata: token\n\n\r\n"
END = b"0\r\n\r\n"


def opened(shared: dict[str, Any], connection_id: int, limit: int = 2) -> ConnectionLimit:
    fault = ConnectionLimit(limit=limit)
    fault.bind(FaultContext(connection_id, random.Random(0), shared=shared))
    fault.on_open(0.0)
    return fault


def test_the_third_of_two_allowed_waits_until_a_response_ends_then_its_request_goes() -> None:
    shared: dict[str, Any] = {}
    first, second, third = (opened(shared, i) for i in (1, 2, 3))
    assert first.on_item(REQUEST, 0.0) == [REQUEST]
    assert second.on_item(REQUEST, 0.0) == [REQUEST]
    assert third.on_item(REQUEST, 0.0) == []  # held: the browser has not sent it
    assert third.deadline() == pytest.approx(0.01)
    assert third.on_deadline(0.01) == []
    first.on_item(Chunk(DOWN, HEAD + EVENT), 0.5)
    assert third.on_deadline(1.0) == []  # the first answer is still streaming
    first.on_item(Chunk(DOWN, END), 2.0)  # its end frees the socket (kept alive)
    assert third.on_deadline(2.005) == [REQUEST]
    assert third.deadline() is None
    assert [(r.action, r.details) for r in third.reports] == [
        ("held", {"busy": 2, "waiting": 1}),
        ("admitted", {"waited": 2.005}),
    ]
    assert shared["busy"] == 2
    # the kept-alive first connection's next request now waits in its turn
    assert first.on_item(REQUEST, 2.1) == []
    second.on_item(Eof(UP), 3.0)
    assert first.on_deadline(3.01) == [REQUEST]


def test_held_requests_are_admitted_first_come_first_served() -> None:
    shared: dict[str, Any] = {}
    first = opened(shared, 1, limit=1)
    first.on_item(REQUEST, 0.0)
    later, latest = opened(shared, 2, limit=1), opened(shared, 3, limit=1)
    later.on_item(REQUEST, 0.1)
    latest.on_item(REQUEST, 0.1)
    first.on_item(Reset(DOWN), 1.0)
    assert latest.on_deadline(1.001) == []  # not its turn
    assert later.on_deadline(1.002) == [REQUEST]


def test_a_held_client_that_gives_up_leaves_the_queue() -> None:
    shared: dict[str, Any] = {}
    first = opened(shared, 1, limit=1)
    first.on_item(REQUEST, 0.0)
    quitter, patient = opened(shared, 2, limit=1), opened(shared, 3, limit=1)
    quitter.on_item(REQUEST, 0.0)
    patient.on_item(REQUEST, 0.0)
    out: list[Item] = quitter.on_item(Reset(UP), 0.5)
    assert out == [REQUEST, Reset(UP)]
    first.on_item(Eof(UP), 1.0)
    assert patient.on_deadline(1.01) == [REQUEST]
    assert shared == {"busy": 1, "waiting": []}


def test_alone_on_a_virtual_clock_the_bytes_pass_whole_and_in_order() -> None:
    fault = ConnectionLimit(limit=1)
    out = replay(fault, [(0.0, REQUEST), (0.1, Chunk(DOWN, HEAD + EVENT + END)), (0.2, Eof(UP))])
    assert joined(out, UP) == REQUEST.data
    assert joined(out, DOWN) == HEAD + EVENT + END
    assert fault.reports == []


@pytest.mark.parametrize("config", [{"limit": 0}, {"poll": 0.0}])
def test_a_bad_config_is_refused(config: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConnectionLimit(**config)  # type: ignore[arg-type]


def test_bytes_that_are_no_http_request_take_a_slot_and_wait_like_any_request() -> None:
    """No bypass: the cap counts bytes, not parsed requests, so garbage or
    a malformed request line over the limit is held as a browser's request would be."""
    shared: dict[str, Any] = {}
    first = opened(shared, 1, limit=1)
    garbage = Chunk(UP, b"\x16\x03\x01\x02\x00 not HTTP at all\r\n\r\n")
    assert first.on_item(garbage, 0.0) == [garbage]  # the one slot
    second = opened(shared, 2, limit=1)
    malformed = Chunk(UP, b"GET\r\n\r\n")
    assert second.on_item(malformed, 0.1) == []  # held, not passed by
    first.on_item(Chunk(DOWN, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), 0.5)
    assert second.on_deadline(0.51) == [malformed]


def test_an_unframeable_response_keeps_its_slot_until_its_connection_ends() -> None:
    """A response with no readable end never frees the slot early: the next request waits
    for the connection's end, the conservative side (a browser's socket stays busy too)."""
    shared: dict[str, Any] = {}
    first = opened(shared, 1, limit=1)
    first.on_item(REQUEST, 0.0)
    second = opened(shared, 2, limit=1)
    assert second.on_item(REQUEST, 0.1) == []
    first.on_item(Chunk(DOWN, b"\x00\x01garbage, no status line\r\n\r\n"), 0.2)
    assert second.on_deadline(0.3) == []  # still busy
    first.on_item(Eof(DOWN), 0.4)
    assert second.on_deadline(0.41) == [REQUEST]
