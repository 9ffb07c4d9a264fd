"""The two watchers behind the proxy's timeouts, driven directly with literal timelines:
HeadWatch (client_header_timeout) and ReadWatch (read_timeout)."""

from __future__ import annotations

from typing import Any, cast

from middlebox.core.stream import Direction
from middlebox.shell.relay import Relay
from middlebox.shell.server import HeadWatch, ReadWatch

UP, DOWN = Direction.UPSTREAM, Direction.DOWNSTREAM


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bytes]] = []

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self.calls.append(("read", leg, data))

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self.calls.append(("wrote", leg, data))

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        self.calls.append(("ended", leg, kind.encode()))


class FakeRelay:
    observer: Any = None


def test_a_head_end_split_across_reads_completes_the_head_and_hands_back_the_observer() -> None:
    inner = Recorder()
    watch = HeadWatch(inner)
    relay = FakeRelay()
    relay.observer = watch
    watch.relay = cast(Relay, relay)
    for part in [b"GET / HTTP/1.1\r", b"\nHost: x\r\n", b"\r", b"\n"]:
        assert not watch.complete
        watch.read("client", UP, part, 0.0)
    assert watch.complete and relay.observer is inner
    assert [call[2] for call in inner.calls] == [
        b"GET / HTTP/1.1\r",
        b"\nHost: x\r\n",
        b"\r",
        b"\n",
    ]


def test_bare_lf_line_ends_count_as_nginx_accepts_them() -> None:
    watch = HeadWatch(None)
    watch.read("client", UP, b"GET / HTTP/1.0\n", 0.0)
    assert not watch.complete
    watch.read("client", UP, b"\n", 0.1)
    assert watch.complete


def test_upstream_bytes_never_complete_the_client_s_head() -> None:
    watch = HeadWatch(None)
    watch.read("upstream", DOWN, b"HTTP/1.1 200 OK\r\n\r\n", 0.0)
    watch.read("client", UP, b"GET / HTTP/1.1\r\nHost: x\r\n", 0.0)
    assert not watch.complete and watch.client_bytes == 25


def test_read_watch_times_only_while_a_request_is_outstanding() -> None:
    watch = ReadWatch(None, now=0.0)
    assert watch.due() is None  # nothing asked yet: an idle connection is never timed
    watch.wrote("upstream", UP, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n", 1.0)
    watch.wrote("upstream", UP, b"\r\n{}", 1.5)
    assert watch.due() == 1.5 and watch.response_bytes == 0
    watch.read("upstream", DOWN, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 4.0)
    assert watch.due() == 4.0 and watch.response_bytes > 0  # after headers: close, not 504
    watch.read("upstream", DOWN, b"3\r\nabc\r\n", 9.0)
    assert watch.due() == 9.0
    watch.read("upstream", DOWN, b"0\r\n\r\n", 9.5)
    assert watch.due() is None and watch.response_bytes == 0  # complete: keep-alive idle
    watch.wrote("upstream", UP, b"HEAD / HTTP/1.1\r\n\r\n", 20.0)
    assert watch.due() == 20.0
    watch.read("upstream", DOWN, b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", 21.0)
    assert watch.due() is None  # a HEAD response has no body, whatever its length says


def test_read_watch_on_traffic_that_is_not_http_times_any_silence_after_it_starts() -> None:
    watch = ReadWatch(None, now=0.0)
    watch.wrote("upstream", UP, b"SSH-2.0-OpenSSH_9.6\r\n\r\n", 2.0)
    assert watch.exchange.requests.degraded is not None
    assert watch.due() == 2.0
    watch.read("upstream", DOWN, b"SSH-2.0-reply\r\n", 3.0)
    assert watch.due() == 3.0
