"""`middlebox load` does not flood what fails: after a failed request a user waits 50 ms,
doubling to 1 s, and goes back to no wait after a success; the summary still counts every
failure by kind, and a URL it cannot use is a usage error naming --url. Virtual time
(trio's MockClock), servers on 127.0.0.1."""

from __future__ import annotations

import itertools
from functools import partial

import pytest
import trio
from click.testing import CliRunner
from trio.testing import MockClock

from middlebox.cli.main import main
from middlebox.tools.load import failure_backoff, run_load
from tests.harness import free_port
from tests.tools.sse_server import GAP, TOKENS, chat_server, read_request

NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
STREAM_TIME = TOKENS * GAP  # how long one successful answer of chat_server takes


def test_the_wait_after_a_failure_doubles_from_50ms_to_at_most_1s() -> None:
    waits = list(itertools.accumulate(range(8), lambda wait, _: failure_backoff(wait), initial=0.0))
    assert waits[1:] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def flaky(arrivals: list[float], failing: set[int]) -> object:
    """chat_server, except that the requests numbered in `failing` (from 1) get a 404;
    `arrivals` gets when each connection came, on the virtual clock."""

    async def serve(stream: trio.SocketStream) -> None:
        arrivals.append(trio.current_time())
        if len(arrivals) not in failing:
            await chat_server(stream)
            return
        async with stream:
            await read_request(stream)
            await stream.send_all(NOT_FOUND)

    return serve


async def test_a_user_waits_longer_after_each_failure_and_not_after_a_success(
    autojump_clock: MockClock,
) -> None:
    arrivals: list[float] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handler = flaky(arrivals, failing={1, 2, 3, 5})
            listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            report = await run_load(f"http://127.0.0.1:{port}", 1, 30, max_requests=6)
            nursery.cancel_scope.cancel()
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    # three 404s: 50, 100, 200 ms; a success: the next at once; a 404: 50 ms again
    assert gaps == pytest.approx([0.05, 0.1, 0.2, STREAM_TIME, 0.05])
    assert (report.requests, report.completed, report.errors) == (6, 2, {"HTTP 404": 4})


async def test_an_upstream_that_refuses_every_connection_gets_a_few_requests_not_thousands(
    autojump_clock: MockClock,
) -> None:
    start = trio.current_time()
    with trio.fail_after(30):
        report = await run_load(f"http://127.0.0.1:{free_port()}", 2, 3.0, ramp=1000)
    # each user: 0, 0.05, 0.15, 0.35, 0.75, 1.55, 2.55 s; its wait after that ends with the run
    assert report.errors == {"connect": 14} and report.requests == 14
    assert trio.current_time() - start == pytest.approx(3.0)
    assert "errors: connect: 14" in report.text()


async def test_successes_back_to_back_wait_for_nothing(autojump_clock: MockClock) -> None:
    arrivals: list[float] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handler = flaky(arrivals, failing=set())
            listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            report = await run_load(f"http://127.0.0.1:{port}", 1, 30, max_requests=4)
            nursery.cancel_scope.cancel()
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert gaps == pytest.approx([STREAM_TIME] * 3)
    assert report.completed == 4 and report.errors == {}


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("notaurl", "expected an http:// URL such as http://127.0.0.1:9000, got 'notaurl'"),
        ("https://127.0.0.1:9000", "expected an http:// URL"),
        ("http://127.0.0.1:0", "expected a port from 1 to 65535 to connect to"),
        ("http://127.0.0.1:99999", "expected a port from 1 to 65535 to connect to"),
    ],
)
def test_a_url_load_cannot_use_is_a_usage_error_naming_the_option(url: str, reason: str) -> None:
    result = CliRunner().invoke(main, ["load", "--url", url, "--duration", "0.1"])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--url': {reason}" in result.output
    assert "requests (" not in result.output  # no run started
