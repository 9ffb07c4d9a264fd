"""Graceful shutdown closes idle kept-alive connections at once (issue 14), as nginx's
`ngx_close_idle_connections` does, and lets an exchange in flight finish: the relay's
`between_messages` (the framing's pure query, what the faults hold, the outboxes)."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import pytest

from faults.latency import Latency
from faults.sse_ids import SseIds
from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import FaultContext, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk
from middlebox.scenario.model import ProxyOptions
from middlebox.shell.relay import Relay

REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


OPEN: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


def relay_over(*faults: object, stages: bool = True) -> tuple[Relay, Pipeline]:
    client_side, upstream_side = PROXY_STAGES.around(ProxyOptions(read_timeout=60.0))
    path = [*client_side, *faults, *upstream_side] if stages else list(faults)
    pipeline = Pipeline(path)  # type: ignore[arg-type]
    pipeline.bind(FaultContext(1, random.Random(0)))
    pipeline.on_open(0.0)
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    for sock in (b, d):
        sock.close()
    OPEN.extend((a, c))
    own = [*client_side, *upstream_side] if stages else []
    return Relay(a, c, pipeline, stages=own), pipeline  # type: ignore[arg-type]


def test_a_connection_is_idle_only_between_a_whole_answer_and_the_next_request() -> None:
    relay, pipeline = relay_over(SseIds())
    assert relay.between_messages()
    pipeline.on_item(Chunk(UP, REQUEST), 1.0)
    assert not relay.between_messages()  # the read timer runs: a stage, but the request waits
    pipeline.on_item(Chunk(DOWN, RESPONSE), 2.0)
    assert relay.between_messages()


def test_a_fault_still_holding_the_answer_keeps_it_busy() -> None:
    relay, pipeline = relay_over(Latency(delay=5.0, direction="downstream"), SseIds())
    pipeline.on_item(Chunk(UP, REQUEST), 1.0)
    pipeline.on_item(Chunk(DOWN, RESPONSE), 2.0)  # framed as it entered, held by the delay
    assert not relay.between_messages()
    pipeline.on_deadline(7.0)
    assert relay.between_messages()


def test_bytes_waiting_in_an_outbox_keep_it_busy() -> None:
    relay, _ = relay_over(SseIds())
    relay.client.outbox.append(b"x")
    assert not relay.between_messages()


def test_an_unframed_pass_through_connection_cannot_say_so_is_never_idle() -> None:
    relay, _ = relay_over(Latency(delay=0.0), stages=False)
    assert not relay.between_messages()
