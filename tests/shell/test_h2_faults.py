"""HTTP/2 connection-level faults on real loopback TLS (core/h2_faults.py executed by
shell/h2_streams.py): goaway, rst_stream (one stream, or the connection), h2_window and
max_concurrent_streams, with the upstream's view of each stream's end."""

from __future__ import annotations

from pathlib import Path

import h2.settings
import trio

from middlebox.shell.tls import LocalCA
from tests.harness import proxied
from tests.shell.test_h2_streams import (
    SSE,
    H2Client,
    RawFrames,
    Seen,
    h2_proxy,
    posts_at_once,
    streaming_upstream,
    tls_scenario,
)

FIRST_EVENT = SSE[: SSE.index(b"\n\n") + 2]


async def test_rst_stream_cancels_the_second_stream_with_its_code_and_the_others_finish(
    tmp_path: Path,
) -> None:
    scenario = tls_scenario(
        "  - rst_stream: {stream: 2, after_events: 1, error_code: CANCEL}\n", tmp_path
    )
    _client, (first, second, third), seen = await posts_at_once(
        tmp_path, scenario, pause=0.02, upstream_ends=3
    )
    # the RST_STREAM follows the DATA frame that completed the first event
    assert second.reset == 0x8 and second.data.startswith(FIRST_EVENT)
    assert b"POST /1" not in second.data and not second.ended
    assert first.ended and first.data == SSE + b"POST /0 HTTP/1.1"
    assert third.ended and third.data == SSE + b"POST /2 HTTP/1.1"
    assert sorted(seen.ends) == ["closed", "closed", "rst"]  # vLLM hears the abort


async def test_rst_stream_with_scope_connection_kills_every_stream_at_once(tmp_path: Path) -> None:
    scenario = tls_scenario("  - rst_stream: {after_events: 1, scope: connection}\n", tmp_path)
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen, forever=True), scenario) as (
        _running,
        client,
    ):
        for n in range(3):
            await client.post(f"/{n}")
        try:
            await client.until(lambda: False)  # until the connection is gone
        except (trio.BrokenResourceError, OSError):
            pass  # the RST
        await seen.wait_for(3)
    assert seen.ends == ["rst", "rst", "rst"]
    assert not any(answer.ended for answer in client.answers.values())


async def test_goaway_after_one_stream_serves_it_and_refuses_the_next(tmp_path: Path) -> None:
    scenario = tls_scenario("  - goaway: {after_streams: 1}\n", tmp_path)
    seen = Seen()
    ca = LocalCA.load_or_create(tmp_path)
    frames = RawFrames()
    with trio.fail_after(10):
        async with proxied(streaming_upstream(seen, pause=0.02), scenario) as running:
            client = await H2Client.connect(running.proxy_port, ca)
            served = await client.post("/served")
            refused = await client.post("/refused")  # sent before the GOAWAY arrives
            while data := await client.stream.receive_some(65536):
                frames.feed(data)  # until the proxy closes the drained connection
            await seen.wait_for(1)
    assert frames.goaway == (served, 0)
    assert served in frames.ended and frames.data[served] == SSE + b"POST /served HTTP/1.1"
    assert frames.resets == {refused: 0x7}  # REFUSED_STREAM: safe to retry elsewhere
    assert len(seen.requests) == 1


async def test_a_stalled_window_stops_one_stream_while_the_other_finishes(tmp_path: Path) -> None:
    scenario = tls_scenario("  - h2_window: {stream: 1, after_bytes: 10}\n", tmp_path)
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen, pause=0.01), scenario) as (
        _running,
        client,
    ):
        stalled = await client.post("/stalled")
        free = await client.post("/free")
        await client.until(lambda: client.answers[free].ended)
        with trio.move_on_after(0.3):
            await client.until(lambda: False)
        assert len(client.answers[stalled].data) == 10 and not client.answers[stalled].ended
        # (the small answer itself sits in the relay's socket buffers meanwhile)
        await client.stream.aclose()
        await seen.wait_for(2)
    assert client.answers[free].data == SSE + b"POST /free HTTP/1.1"


async def test_max_concurrent_streams_is_announced_in_the_servers_settings(tmp_path: Path) -> None:
    scenario = tls_scenario("  - max_concurrent_streams: {limit: 2}\n", tmp_path)
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen), scenario) as (_running, client):
        stream_id = await client.post("/one")
        await client.until(client.all_over)
    assert client.conn.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 2
    assert client.answers[stream_id].ended


async def test_a_stream_past_the_announced_limit_is_refused_alone_as_nginx_does(
    tmp_path: Path,
) -> None:
    """nginx 1.22 answers the 129th concurrent stream with RST_STREAM REFUSED_STREAM and
    serves the other 128 (docs/tls-http2.md); h2 alone would fail the whole connection."""
    scenario = tls_scenario("  - max_concurrent_streams: {limit: 2}\n", tmp_path)
    # sent before the client read the server's SETTINGS, so its h2 lets them through
    client, (first, second, third), seen = await posts_at_once(
        tmp_path, scenario, pause=0.02, upstream_ends=2
    )
    assert third.reset == 0x7 and third.data == b""  # REFUSED_STREAM: safe to retry
    assert first.ended and first.data == SSE + b"POST /0 HTTP/1.1"
    assert second.ended and second.data == SSE + b"POST /1 HTTP/1.1"
    assert len(seen.requests) == 2  # the refused stream never reached the upstream
    assert client.conn.state_machine.state.name != "CLOSED"  # the connection lives on
