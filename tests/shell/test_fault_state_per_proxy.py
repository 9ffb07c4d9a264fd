"""Cross-connection fault state belongs to one proxy: each client's proxy counts alone.

`middlebox run` gives every client its own ProxyServer (run/client_runs.py), and the
clients of one scenario, and the scenarios of a `--jobs 2` run, share one process. A
count kept in a fault position's scenario-lifetime state ("the first connection vanishes",
`client_vanish: {connections: 1}`; "the first two requests get a 429", `match: {first: 2}`)
must be each proxy's own: were it shared, whichever client connected first would take the
fault and the others would read the whole answer (client-vanishes/httpx-sse was seen to
in CI, "fired for openai, raw but never for httpx-sse"). Driven without sockets: the
pipelines the servers make, fed the bytes of one request and its SSE answer.
"""

from __future__ import annotations

from middlebox.compose import PROXY_STAGES, load
from middlebox.core.fault import Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from middlebox.library import scenario_dir
from middlebox.shell.server import Address, ProxyConfig, ProxyServer

LIBRARY = scenario_dir()
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)


def answer(events: int) -> bytes:
    """A chunked SSE answer of `events` data events, one HTTP chunk each."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    chunks = b""
    for index in range(events):
        event = b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % index
        chunks += b"%x\r\n%s\r\n" % (len(event), event)
    return head + chunks


def vanished(pipeline: Pipeline, events: int = 20) -> bool:
    """Whether this connection's client vanishes (the proxy half-closes upstream) while
    `events` SSE events come back for its one request."""
    out = pipeline.on_open(0.0)
    out += pipeline.on_item(Chunk(UP, REQUEST), 0.1)
    out += pipeline.on_item(Chunk(DOWN, answer(events)), 0.2)
    return any(isinstance(item, Eof) and item.direction is UP for item in out)


def proxies(scenario_name: str) -> list[ProxyServer]:
    """Two clients' proxies for one scenario, as `middlebox run` makes them."""
    scenario = load(LIBRARY / f"{scenario_name}.yaml")
    config = ProxyConfig(Address("127.0.0.1", 9), scenario, stages=PROXY_STAGES)
    return [ProxyServer(config) for _ in range(2)]


def test_each_clients_proxy_counts_its_own_connections_for_client_vanish() -> None:
    first, second = proxies("client-vanishes")  # connections: 1, after 12 events
    scenario = first.scenario
    assert vanished(first.make_pipeline(scenario, 1))
    assert not vanished(first.make_pipeline(scenario, 2))  # the retry after the stall
    # another client's proxy in the same process: its first connection vanishes too
    assert vanished(second.make_pipeline(scenario, 1))
    assert first.shared[0] is not second.shared[0]


def test_the_vanish_waits_for_the_twelfth_event() -> None:
    first, _ = proxies("client-vanishes")
    assert not vanished(first.make_pipeline(first.scenario, 1), events=11)


def test_each_clients_proxy_answers_its_own_first_two_requests_429() -> None:
    first, second = proxies("rate-limit-storm")  # http_error 429, match: {first: 2}

    def status(server: ProxyServer, connection: int) -> bytes:
        pipeline = server.make_pipeline(server.scenario, connection)
        out = pipeline.on_open(0.0) + pipeline.on_item(Chunk(UP, REQUEST), 0.1)
        written = b"".join(i.data for i in out if isinstance(i, Chunk) and i.direction is DOWN)
        return written[9:12] or b"passed on"

    assert [status(first, n) for n in (1, 2, 3)] == [b"429", b"429", b"passed on"]
    assert [status(second, n) for n in (1, 2)] == [b"429", b"429"]
