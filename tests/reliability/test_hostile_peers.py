"""Hostile peers: slowloris, readers that never read, upstreams that never answer,
floods, half-open connections and RST storms. Each test asserts the proxy's answer and
that file descriptors and tasks come back to where they were (no leaks).

Real loopback sockets throughout; the timeout tests run on trio's MockClock (autojump), so
their waits are virtual and their times exact. Those that involve another process (fd
exhaustion) or many concurrent connections racing the kernel keep real time."""

from __future__ import annotations

import resource
import signal
import socket
import subprocess
import time
from functools import partial

import pytest
import trio
from trio.testing import MockClock

from faults.coalescer import Coalescer
from middlebox.compose import PROXY_STAGES
from middlebox.scenario.model import FaultSpec, ProxyOptions, Scenario
from middlebox.shell.relay import HIGH_WATER
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, listen
from tests.harness import proxied, read_all, reset
from tests.reliability.support import (
    FULL,
    MIDDLEBOX,
    blackhole,
    fd_baseline,
    fds_back_to,
    first_line,
    rss_bytes,
    settle,
    task_count,
)

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


def options(**values: object) -> Scenario:
    return Scenario(name="hostile", proxy=ProxyOptions(**values))  # type: ignore[arg-type]


async def answer_once(stream: trio.SocketStream) -> None:
    data = b""
    while b"{}" not in data:
        more = await stream.receive_some(65536)
        if not more:
            return
        data += more
    await stream.send_all(RESPONSE)
    await read_all(stream)


# ---------------------------------------------------------------- slowloris

SLOWLORIS = 300 if FULL else 20


async def test_slowloris_clients_are_closed_unanswered_at_client_header_timeout(
    autojump_clock: MockClock,
) -> None:
    baseline, tasks = fd_baseline(), task_count()
    upstream_got: list[bytes] = []

    async def upstream(stream: trio.SocketStream) -> None:
        data, _ = await read_all(stream)
        upstream_got.append(data)

    with trio.fail_after(10):
        async with proxied(upstream, options(client_header_timeout=0.3)) as running:
            started = trio.current_time()
            clients = [await running.connect() for _ in range(SLOWLORIS)]
            for client in clients:
                await client.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            drip = clients[0]
            for _ in range(3):  # a drip of header bytes does not extend the deadline
                await trio.sleep(0.05)
                await drip.send_all(b"X-Slow: 1\r\n")
            endings = [await read_all(client) for client in clients]
            elapsed = trio.current_time() - started
            assert await settle(lambda: running.server.active == 0)
            assert running.server.header_timeouts == SLOWLORIS
            for client in clients:
                await client.aclose()
            assert await settle(lambda: len(upstream_got) == SLOWLORIS)
    assert endings == [(b"", "fin")] * SLOWLORIS  # nginx closes on a header timeout, no 408 sent
    assert elapsed == pytest.approx(0.3)  # virtual time: exactly the header timeout
    assert await fds_back_to(baseline) == baseline
    assert task_count() == tasks


async def test_a_client_that_completes_its_head_in_time_streams_past_the_header_timeout(
    autojump_clock: MockClock,
) -> None:
    async def slow_upstream(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await trio.sleep(0.5)  # longer than the header timeout
        await stream.send_all(RESPONSE)
        await stream.send_eof()

    with trio.fail_after(10):
        async with proxied(slow_upstream, options(client_header_timeout=0.2)) as running:
            client = await running.connect()
            await client.send_all(HEAD)
            received, end = await read_all(client)
    assert (received, end) == (RESPONSE, "fin")
    assert running.server.header_timeouts == 0


async def test_without_a_header_timeout_an_idle_client_is_left_alone(
    autojump_clock: MockClock,
) -> None:
    with trio.fail_after(10):
        async with proxied(answer_once, options(client_header_timeout=None)) as running:
            client = await running.connect()
            await trio.sleep(0.4)
            assert running.server.active == 1
            await client.send_all(HEAD)
            assert await client.receive_some(100) == RESPONSE
            await client.aclose()
    assert running.server.header_timeouts == 0


def test_the_header_timeout_defaults_to_nginx_s_sixty_seconds_and_read_timeout_is_off() -> None:
    assert ProxyOptions().client_header_timeout == 60.0
    assert ProxyOptions().read_timeout is None
    assert ProxyOptions().max_connections is None


# ---------------------------------------------------------- readers that never read


async def test_a_client_that_never_reads_stalls_the_upstream_with_bounded_memory(
    autojump_clock: MockClock,
) -> None:
    block = bytes(range(256)) * 256  # 64 KiB
    total_blocks = 48 * 16  # 48 MiB offered by the upstream
    sent = [0]

    async def firehose(stream: trio.SocketStream) -> None:
        await stream.receive_some(100)
        for _ in range(total_blocks):
            await stream.send_all(block)
            sent[0] += len(block)
        await stream.send_eof()

    with trio.fail_after(20):
        async with proxied(firehose) as running:
            rss_before = rss_bytes()
            client = await running.connect()
            await client.send_all(HEAD)
            # the client reads nothing: wait until the upstream's writes stop advancing
            stalled_at = -1
            for _ in range(50):
                if sent[0] == stalled_at:
                    break
                stalled_at = sent[0]
                await trio.sleep(0.2)
            assert sent[0] == stalled_at, "the upstream kept sending into a closed window"
            rss_growth = rss_bytes() - rss_before
            received, end = await read_all(client)
    # Kernel buffers on both legs plus the relay's HIGH_WATER outbox, far below 48 MiB.
    assert stalled_at < 24 * 1024 * 1024
    assert rss_growth < 4 * HIGH_WATER + 8 * 1024 * 1024
    assert end == "fin" and len(received) == total_blocks * len(block)
    assert received[: len(block)] == block and received[-len(block) :] == block


# ---------------------------------------------------- upstreams that never answer


async def test_an_upstream_that_never_accepts_gets_a_502_after_connect_timeout(
    autojump_clock: MockClock,
) -> None:
    listener, fillers = blackhole()
    scenario = options(connect_timeout=0.3)
    try:
        async with trio.open_nursery() as nursery:
            upstream = Address("127.0.0.1", listener.getsockname()[1])
            server = ProxyServer(ProxyConfig(upstream, scenario, stages=PROXY_STAGES))
            proxy_listener = listen(Address("127.0.0.1", 0))
            port = await nursery.start(server.serve, proxy_listener)
            with trio.fail_after(5):
                client = await trio.open_tcp_stream("127.0.0.1", port)
                await client.send_all(HEAD)
                started = trio.current_time()
                received, end = await read_all(client)
                waited = trio.current_time() - started
            nursery.cancel_scope.cancel()
        proxy_listener.close()
    finally:
        for sock in [listener, *fillers]:
            sock.close()
    assert received.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and end == "fin"
    assert waited == pytest.approx(0.3)  # exactly connect_timeout
    assert server.connections_failed == 1


async def test_read_timeout_answers_504_when_the_upstream_sends_no_response_header(
    autojump_clock: MockClock,
) -> None:
    upstream_ends: list[str] = []

    async def mute(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        _, end = await read_all(stream)  # never answers; sees how the proxy leaves
        upstream_ends.append(end)

    baseline = fd_baseline()
    with trio.fail_after(10):
        async with proxied(mute, options(read_timeout=0.3)) as running:
            client = await running.connect()
            await client.send_all(HEAD)
            started = trio.current_time()
            received, end = await read_all(client)
            waited = trio.current_time() - started
            await client.aclose()
            assert await settle(lambda: running.server.active == 0 and bool(upstream_ends))
    assert received.startswith(b"HTTP/1.1 504 Gateway Time-out\r\n")  # nginx's spelling
    assert b"<center><h1>504 Gateway Time-out</h1></center>" in received
    assert end == "fin" and upstream_ends == ["rst"]
    assert waited == pytest.approx(0.3)  # exactly read_timeout
    assert running.server.read_timeouts == 1
    assert await fds_back_to(baseline) == baseline


async def test_read_timeout_mid_response_closes_the_connection_like_nginx(
    autojump_clock: MockClock,
) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n"

    async def stalls(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(head)
        await trio.sleep_forever()

    with trio.fail_after(10):
        async with proxied(stalls, options(read_timeout=0.3)) as running:
            client = await running.connect()
            await client.send_all(HEAD)
            received, end = await read_all(client)
    assert (received, end) == (head, "fin")  # a truncated chunked body: no last chunk
    assert running.server.read_timeouts == 1


async def test_read_timeout_never_fires_on_an_idle_keep_alive_connection(
    autojump_clock: MockClock,
) -> None:
    with trio.fail_after(10):
        async with proxied(answer_once, options(read_timeout=0.2)) as running:
            client = await running.connect()
            await client.send_all(HEAD)
            assert await client.receive_some(100) == RESPONSE
            await trio.sleep(0.5)  # the response is complete: nothing is outstanding
            assert running.server.active == 1
            await client.aclose()
    assert running.server.read_timeouts == 0


# ------------------------------------------------------------------- floods


async def test_a_flood_beyond_max_connections_is_closed_and_counted() -> None:
    release = trio.Event()

    async def holds(stream: trio.SocketStream) -> None:
        await release.wait()
        await stream.send_all(b"ok")

    baseline, tasks = fd_baseline(), task_count()
    with trio.fail_after(10):
        async with proxied(holds, options(max_connections=5)) as running:
            held = [await running.connect() for _ in range(5)]
            assert await settle(lambda: running.server.active == 5)
            flood = [await running.connect() for _ in range(35)]
            refused = [await read_all(client) for client in flood]
            release.set()
            answers = [await client.receive_some(10) for client in held]
            for client in [*held, *flood]:
                await client.aclose()
            assert await settle(lambda: running.server.active == 0)
    assert all(data == b"" for data, _ in refused)
    assert answers == [b"ok"] * 5
    assert running.server.connections_refused == 35
    assert running.server.connections_accepted == 5
    assert await fds_back_to(baseline) == baseline
    assert task_count() == tasks


async def test_the_cli_limit_overrides_the_scenario_s() -> None:
    config = ProxyConfig(Address("127.0.0.1", 1), options(max_connections=9), max_connections=2)
    assert ProxyServer(config).connection_limit() == 2
    unset = ProxyConfig(Address("127.0.0.1", 1), options(max_connections=9))
    assert ProxyServer(unset).connection_limit() == 9


async def test_three_hundred_short_connections_leave_no_fd_or_task_behind() -> None:
    baseline, tasks = fd_baseline(), task_count()
    with trio.fail_after(20):
        async with proxied(answer_once) as running:

            async def one() -> None:
                client = await running.connect()
                await client.send_all(HEAD)
                assert await client.receive_some(100) == RESPONSE
                await client.aclose()

            for _ in range(6):
                async with trio.open_nursery() as nursery:
                    for _ in range(50):
                        nursery.start_soon(one)
            assert await settle(lambda: running.server.active == 0)
    assert running.server.connections_accepted == 300
    assert await fds_back_to(baseline) == baseline
    assert task_count() == tasks


def test_listen_uses_the_requested_backlog() -> None:
    listener = listen(Address("127.0.0.1", 0), backlog=7)
    try:
        port = listener.getsockname()[1]
        import subprocess

        table = subprocess.run(
            ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, timeout=5
        ).stdout.split()
    finally:
        listener.close()
    assert table[0] == "LISTEN" and table[2] == "7"  # Send-Q of a listener is its backlog


# ------------------------------------------------- half-open and RST storms


@pytest.mark.parametrize("fault", [None, Coalescer], ids=["pass-through", "coalescer"])
async def test_a_client_gone_mid_stream_resets_an_upstream_that_ignores_its_fin(
    fault: type[Coalescer] | None, autojump_clock: MockClock
) -> None:
    """The client closes mid-response (its FIN, then an RST from its kernel at our next
    write) while the upstream ignores the FIN and streams on: the client's RST travels on
    to the upstream, as a TCP hop carries it (and as nginx closes the upstream once a write
    to the client fails), so a server that ignores half-closes cannot hold the connection."""
    upstream_end: list[str] = []

    async def endless(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        try:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(20_000):  # bounded: 20,000 ms of stream at most
                await stream.send_all(b"5\r\nhello\r\n")
                await trio.sleep(0.001)
            upstream_end.append("still streaming")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            upstream_end.append("reset")

    chosen = Scenario(name="t", path=(FaultSpec(fault, {}),)) if fault else None
    baseline = fd_baseline()
    with trio.fail_after(15):
        async with proxied(endless, chosen) as running:
            client = await running.connect()
            await client.send_all(HEAD)
            assert await client.receive_some(65536)
            await client.aclose()  # FIN now; the kernel answers later bytes with an RST
            assert await settle(lambda: bool(upstream_end), 10)
            assert await settle(lambda: running.server.active == 0)
    assert upstream_end == ["reset"]
    assert await fds_back_to(baseline) == baseline


async def test_half_closed_clients_still_get_their_whole_response() -> None:
    async def after_fin(stream: trio.SocketStream) -> None:
        request, end = await read_all(stream)
        assert end == "fin"
        await stream.send_all(request[::-1] * 100)
        await stream.send_eof()

    baseline = fd_baseline()
    with trio.fail_after(10):
        async with proxied(after_fin) as running:

            async def one(index: int) -> None:
                client = await running.connect()
                request = f"request {index}".encode()
                await client.send_all(request)
                await client.send_eof()  # half-open: we still read
                received, end = await read_all(client)
                assert (received, end) == (request[::-1] * 100, "fin")
                await client.aclose()

            async with trio.open_nursery() as nursery:
                for index in range(50):
                    nursery.start_soon(one, index)
            assert await settle(lambda: running.server.active == 0)
    assert await fds_back_to(baseline) == baseline


async def test_an_rst_storm_from_both_sides_leaves_the_proxy_serving_and_leak_free() -> None:
    async def upstream(stream: trio.SocketStream) -> None:
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            return  # the client's RST reached us through the proxy, as it should
        if data.startswith(b"RST"):
            await stream.send_all(b"HTTP/1.1 200 OK\r\n\r\npartial")
            reset(stream)  # the upstream aborts mid-response
            return
        if data.startswith(b"GET"):
            await stream.send_all(RESPONSE)
            await stream.send_eof()
        await read_all(stream)

    baseline, tasks = fd_baseline(), task_count()
    with trio.fail_after(20):
        async with proxied(upstream) as running:

            async def client_resets(kind: int) -> None:
                client = await running.connect()
                if kind == 0:
                    reset(client)  # RST right after the handshake
                    return
                if kind == 1:
                    await client.send_all(b"POST /x HTTP/1.1\r\nHo")
                    await trio.lowlevel.checkpoint()
                    reset(client)  # RST in the middle of a request head
                    return
                await client.send_all(b"RST please")
                _, end = await read_all(client)
                assert end == "rst"
                await client.aclose()

            for _ in range(3):
                async with trio.open_nursery() as nursery:
                    for index in range(100):
                        nursery.start_soon(client_resets, index % 3)
            assert await settle(lambda: running.server.active == 0, 5)
            healthy = await running.connect()
            await healthy.send_all(b"GET / HTTP/1.1\r\n\r\n")
            assert (await read_all(healthy)) == (RESPONSE, "fin")
            await healthy.aclose()
    assert running.server.connections_accepted == 301
    assert await fds_back_to(baseline) == baseline
    assert task_count() == tasks


async def test_connections_from_a_stdlib_socket_that_closes_mid_write_do_not_crash() -> None:
    # A blocking stdlib client in a thread, closing while the proxy still writes to it.
    async def chatty(stream: trio.SocketStream) -> None:
        await stream.receive_some(100)
        try:
            for _ in range(200):
                await stream.send_all(b"x" * 65536)
        except trio.BrokenResourceError:
            pass

    def quitter(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(HEAD)
            sock.recv(10)
        time.sleep(0.01)

    with trio.fail_after(10):
        async with proxied(chatty) as running:
            for _ in range(5):
                await trio.to_thread.run_sync(quitter, running.proxy_port)
            assert await settle(lambda: running.server.active == 0, 5)
    assert running.server.connections_accepted == 5


async def test_running_out_of_file_descriptors_pauses_accepting_and_then_recovers() -> None:
    """A proxy limited to 40 fds (RLIMIT_NOFILE) under 40 simultaneous clients: accept
    fails with EMFILE, the proxy pauses accepting (nginx's accept_mutex_delay), and
    every client still gets an answer: the response, or nginx's 502 when even the
    upstream socket could not be created. Afterwards it serves normally."""

    def limit_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, answer_once, 0, host="127.0.0.1"))
        upstream_port = listeners[0].socket.getsockname()[1]
        process = await trio.lowlevel.open_process(
            [
                *MIDDLEBOX,
                *("proxy", "--listen", "127.0.0.1:0", "--grace", "0"),
                *("--upstream", f"http://127.0.0.1:{upstream_port}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=limit_fds,
        )
        try:
            line = await first_line(process)
            port = int(line.split("http://127.0.0.1:", 1)[1].split()[0])
            answers: list[bytes] = []
            stderr_bytes = bytearray()
            exhausted = trio.Event()

            async def read_stderr() -> None:
                assert process.stderr is not None
                while data := await process.stderr.receive_some(65536):
                    stderr_bytes.extend(data)
                    if b"Too many open files" in stderr_bytes:
                        exhausted.set()

            nursery.start_soon(read_stderr)

            async def one() -> None:
                client = await trio.open_tcp_stream("127.0.0.1", port)
                await client.send_all(HEAD)
                # every client holds its connection until the proxy has run out of fds,
                # however slowly the machine lets them connect
                await exhausted.wait()
                received = b""
                while len(received) < len(RESPONSE) and b"</html>" not in received:
                    data = await client.receive_some(65536)
                    if not data:
                        break
                    received += data
                answers.append(received)
                await client.aclose()

            with trio.fail_after(20):
                async with trio.open_nursery() as clients:
                    for _ in range(40):
                        clients.start_soon(one)
                recovered = False
                with trio.move_on_after(5):  # once the flood's connections have closed
                    while not recovered:
                        healthy = await trio.open_tcp_stream("127.0.0.1", port)
                        await healthy.send_all(HEAD)
                        recovered = await healthy.receive_some(100) == RESPONSE
                        await healthy.aclose()
                        await trio.sleep(0.05)
                process.send_signal(signal.SIGTERM)
                code = await process.wait()
            stderr = stderr_bytes.decode()
        finally:
            if process.returncode is None:
                process.kill()  # the process we started, by its handle
                await process.wait()
        nursery.cancel_scope.cancel()
    assert recovered
    assert len(answers) == 40
    assert all(a == RESPONSE or a.startswith(b"HTTP/1.1 502 Bad Gateway") for a in answers), [
        a for a in answers if a != RESPONSE and not a.startswith(b"HTTP/1.1 502")
    ]
    # How many fit in 40 fds depends on what the interpreter itself holds open (the
    # relay's read hub takes one more); that some were served is the point.
    assert answers.count(RESPONSE) >= 1
    assert "accept failed: [Errno 24] Too many open files; pausing accepts" in stderr
    assert code == 0
