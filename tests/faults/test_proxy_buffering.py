"""proxy_buffering: nginx's event pipe releases a response in full buffers, head included.

The stream in most tests is a 95-byte SSE head at 1 s, then one 200-byte HTTP chunk
(one token) per second from 2 s on, as vLLM writes it.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults._lib.hop_close import HopClose
from faults._lib.match import RequestMatch
from faults.proxy_buffering import ProxyBuffering
from faults.sse_ids import SseIds
from faults.testing import TimedItem, joined, replay
from middlebox.core.fault import Pipeline
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.httpstreams import (
    DONE,
    REQUEST,
    SSE_HEAD,
    chunked,
    down_bytes,
    ends,
    event,
    resliced,
    timeline,
)

TOKEN = encode_chunk(event("x" * 138))
assert (len(SSE_HEAD), len(TOKEN)) == (95, 200)


def stream(tokens: int) -> list[bytes]:
    return [SSE_HEAD, *[TOKEN] * tokens, *chunked(DONE), LAST_CHUNK_BYTES]


def releases(out: list[TimedItem]) -> list[tuple[float, int]]:
    return [(t, len(i.data)) for t, i in out if isinstance(i, Chunk) and i.direction is DOWN]


def test_a_token_stream_arrives_in_4k_bursts_the_first_with_the_head() -> None:
    writes = stream(50)
    fault = ProxyBuffering()
    out = replay(fault, timeline(writes))
    total = sum(map(len, writes))
    # 95 + 21 x 200 fills the 4096-byte header buffer at the 21st token (22 s); 199 bytes
    # carry over, and 20 more tokens fill the next buffer at 42 s; the rest goes at the end.
    assert releases(out) == [(22.0, 4096), (42.0, 4096), (53.0, total - 8192)]
    assert down_bytes(out) == b"".join(writes)
    assert [r.details["reason"] for r in fault.reports if r.action == "released"] == [
        "buffer_full",
        "buffer_full",
        "upstream_done",
    ]


def test_with_8k_buffers_the_bursts_are_8k() -> None:
    out = replay(ProxyBuffering(buffer_size=8192, buffers_size=8192), timeline(stream(45)))
    assert releases(out)[:1] == [(42.0, 8192)]


def test_with_http_1_1_each_complete_chunk_is_released_but_postpone_output_batches_them() -> None:
    out = replay(ProxyBuffering(proxy_http_version="1.1"), timeline(stream(20)))
    # head + 7 tokens = 1495 >= 1460 at 8 s, then 8 tokens = 1600 at 16 s, the rest at the end.
    assert releases(out) == [(8.0, 1495), (16.0, 1600), (23.0, 5 * 200 + 19 + 5)]


def test_with_http_1_1_a_read_goes_out_once_it_holds_the_minimal_rest_of_the_chunked_body() -> None:
    fault = ProxyBuffering(proxy_http_version="1.1", postpone_output=0)
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, REQUEST)),
            (1.0, Chunk(DOWN, SSE_HEAD + TOKEN[:100])),
            (2.0, Chunk(DOWN, TOKEN[100:])),
            (3.0, Chunk(DOWN, TOKEN)),
        ],
    )
    # At a chunk start p->length is 3, so the first 100 bytes go at once; then the
    # parser is 96 bytes into a 194-byte chunk and wants 98 + 4 = 102 bytes: the next
    # 100 wait for the following read.
    assert releases(out) == [(1.0, 95 + 100), (3.0, 300)]


def test_x_accel_buffering_no_turns_buffering_off_for_that_response() -> None:
    head = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nX-Accel-Buffering: no\r\n\r\n")
    writes = [head, TOKEN, TOKEN]
    fault = ProxyBuffering()
    out = replay(fault, timeline(writes))
    assert releases(out) == [(1.0, len(head)), (2.0, 200), (3.0, 200)]
    assert fault.reports[0].action == "not_buffering"


def test_proxy_ignore_headers_x_accel_buffering_keeps_buffering() -> None:
    head = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nX-Accel-Buffering: no\r\n\r\n")
    out = replay(ProxyBuffering(honour_x_accel_buffering=False), timeline([head, TOKEN, TOKEN]))
    assert releases(out) == []


def test_a_small_json_response_goes_out_whole_when_it_is_complete() -> None:
    body = b'{"choices":[]}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n"
    out = replay(ProxyBuffering(), timeline([head, body[:5], body[5:]]))
    assert releases(out) == [(3.0, len(head) + 14)]


def test_an_upstream_close_flushes_a_read_until_close_body_then_passes_the_fin() -> None:
    head = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    out = replay(
        ProxyBuffering(),
        [
            (0.0, Chunk(UP, REQUEST)),
            (1.0, Chunk(DOWN, head)),
            (2.0, Chunk(DOWN, b"data: a\n\n")),
            (3.0, Eof(DOWN)),
        ],
    )
    assert out[1:] == [(3.0, Chunk(DOWN, head + b"data: a\n\n")), (3.0, Eof(DOWN))]


def test_each_response_on_a_keep_alive_connection_is_buffered_on_its_own() -> None:
    first = b"".join(stream(1))
    out = replay(
        ProxyBuffering(),
        [
            (0.0, Chunk(UP, REQUEST)),
            (1.0, Chunk(DOWN, first)),
            (2.0, Chunk(UP, REQUEST)),
            (3.0, Chunk(DOWN, SSE_HEAD)),
            (4.0, Chunk(DOWN, TOKEN)),
        ],
    )
    assert releases(out) == [(1.0, len(first))]


def test_a_head_larger_than_proxy_buffer_size_gets_nginx_502() -> None:
    big = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nX-Big: " + b"y" * 5000 + b"\r\n\r\n")
    fault = ProxyBuffering()
    out = replay(fault, timeline([big, TOKEN]))
    assert out[1:] == [
        (1.0, Chunk(DOWN, error_response(502))),
        (1.0, Eof(DOWN)),
        (1.0, Eof(UP)),
    ]
    assert fault.reports[0].action == "too_big_header"


def test_the_502_for_a_too_big_head_is_what_an_http_fault_nearer_the_client_reads() -> None:
    # The page replaces the upstream's head: the faults nearer the client frame the page
    # (proxy_buffering `changes` the responses), not the 200 head it stands for.
    big = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nX-Big: " + b"y" * 5000 + b"\r\n\r\n")
    ids = SseIds()
    out = replay(Pipeline([ids, ProxyBuffering()]), timeline([big, TOKEN]))
    assert joined(out, DOWN) == error_response(502)
    assert not ids.fired  # a page, no event stream to number


def test_responses_the_match_does_not_select_pass_at_once() -> None:
    fault = ProxyBuffering(match=RequestMatch(path="/v1/completions"))
    out = replay(fault, timeline([SSE_HEAD, TOKEN]))
    assert releases(out) == [(1.0, 95), (2.0, 200)]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"buffer_size": 0}, "buffer_size must be > 0"),
        ({"buffers_size": -1}, "buffers_size must be > 0"),
        ({"proxy_http_version": "2"}, "proxy_http_version must be one of"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ProxyBuffering(**config)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 60), st.data())
def test_bytes_are_preserved_and_released_only_at_buffer_boundaries_or_the_end(
    tokens: int, data: st.DataObject
) -> None:
    wire = b"".join(stream(tokens))
    writes = data.draw(resliced(wire, max_cuts=12))
    out = replay(ProxyBuffering(), timeline(writes))
    assert down_bytes(out) == wire
    cumulative = list(itertools.accumulate(size for _, size in releases(out)))
    assert all(offset % 4096 == 0 for offset in cumulative[:-1])
    times = [t for t, _ in out]
    assert times == sorted(times)


@given(st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_decisions(seed: int) -> None:
    def run() -> list[TimedItem]:
        fault = ProxyBuffering(match=RequestMatch(probability=0.5))
        return replay(fault, timeline(stream(3)), seed=seed)

    assert run() == run()


CLOSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
BARE_TOKEN = event("x" * 144)  # a close-delimited body has no chunk framing to count
assert (len(CLOSE_HEAD), len(BARE_TOKEN)) == (71, 200)


def close_delimited(tokens: int) -> list[TimedItem]:
    """An HTTP/1.0 upstream leg: the head at 1 s, one 200-byte event a second after."""
    return timeline([CLOSE_HEAD, *[BARE_TOKEN] * tokens])


def test_a_close_delimited_body_fills_the_buffer_with_body_bytes_only() -> None:
    out = replay(ProxyBuffering(), [*close_delimited(30), (40.0, Eof(DOWN))])
    # 71 + 21 x 200 = 4271 bytes fill the first 4096 bytes at the 21st event (22 s).
    assert releases(out) == [(22.0, 4096), (40.0, 71 + 30 * 200 - 4096)]
    assert ends(out) == [(40.0, Eof(DOWN))]


def test_a_read_timeout_drops_the_partial_buffer_and_sends_only_the_full_ones() -> None:
    fault = ProxyBuffering()
    out = replay(fault, [*close_delimited(30), (91.0, HopClose(DOWN))])
    # The first buffer went out at 22 s; the next 4096 would have been 175 + 20 x 200:
    # it holds 175 + 9 x 200 = 1975 bytes when nginx's proxy_read_timeout fires, lost.
    assert releases(out) == [(22.0, 4096)]
    assert ends(out) == [(91.0, HopClose(DOWN))] and isinstance(out[-1][1], HopClose)
    dropped = [r for r in fault.reports if r.action == "dropped_partial"]
    assert [(r.time, r.details["size"]) for r in dropped] == [(91.0, 1975)]


def test_a_read_timeout_before_any_buffer_filled_sends_the_head_alone() -> None:
    # ngx_http_send_header had put the head in the write filter; NGX_HTTP_FLUSH sends it.
    out = replay(ProxyBuffering(), [*close_delimited(3), (65.0, HopClose(DOWN))])
    assert out[1:] == [(65.0, Chunk(DOWN, CLOSE_HEAD)), (65.0, HopClose(DOWN))]


def test_the_upstreams_own_fin_still_releases_the_partial_buffer() -> None:
    out = replay(ProxyBuffering(), [*close_delimited(3), (65.0, Eof(DOWN))])
    assert out[1:] == [(65.0, Chunk(DOWN, CLOSE_HEAD + BARE_TOKEN * 3)), (65.0, Eof(DOWN))]
