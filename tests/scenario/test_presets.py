"""The proxy presets: each loads, expands to real faults, and on a virtual clock shows the
behaviour `make calibrate` measured on the real proxy (docs/calibration.md).

The stream is what vLLM sends: a chunked 200 head 20 ms before the first token, then a
~330-byte `data:` frame every 20 ms (one HTTP chunk each), `[DONE]` and the last chunk.
"""

from __future__ import annotations

import gzip
import zlib

import pytest

from calibrate.compare import Tolerance, bursts, compare, end_kind, largest_gap
from calibrate.probe import Reads, decode
from calibrate.suite import preset_path
from faults import REGISTRY
from faults.presets import PRESETS
from faults.testing import TimedItem, replay
from middlebox.core.fault import Pipeline
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from middlebox.scenario.load import load_scenario_text
from middlebox.scenario.model import FaultSpec
from tests.faults.httpprops import dechunked
from tests.faults.httpstreams import (
    REQUEST,
    SSE_HEAD,
    down_bytes,
    ends,
    sse_response,
    timeline,
)

ITL = 0.02
TOKENS = [f"tok{i:02d} " + "x" * 250 for i in range(60)]


def pipeline(name: str) -> Pipeline:
    scenario = load_scenario_text(
        f"name: t\npath:\n  - preset: {name}\n", REGISTRY, presets=PRESETS
    )
    return Pipeline(spec.build() for spec in scenario.path)


def stream(tokens: list[str] = TOKENS) -> list[TimedItem]:
    return timeline(sse_response(*tokens), step=ITL)


def down_times(output: list[TimedItem]) -> list[float]:
    return [t for t, i in output if isinstance(i, Chunk) and i.direction is DOWN]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loads_and_expands_into_registered_faults(name: str) -> None:
    scenario = load_scenario_text(
        f"name: t\npath:\n  - latency: {{delay: 1ms}}\n  - preset: {name}\n", REGISTRY,
        presets=PRESETS,
    )  # fmt: skip
    assert scenario.path[0].name == "latency"
    assert all(spec.cls is REGISTRY[spec.name] for spec in scenario.path)
    replay(pipeline(name), stream())  # and each runs a whole stream without error


def test_the_presets_expand_to_the_faults_docs_calibration_names() -> None:
    expanded = {name: [spec.name for spec in pipeline_specs(name)] for name in PRESETS}
    assert expanded == {
        "passthrough": [],
        "nginx-default": ["strip_header", "http10_upstream", "proxy_buffering", "idle_reaper"],
        "nginx-streaming": ["strip_header", "http10_upstream", "idle_reaper"],
        "nginx-gzip": [
            "strip_header",
            "gzip_encoding",
            "http10_upstream",
            "proxy_buffering",
            "idle_reaper",
        ],
        "haproxy-default": ["coalescer", "ignore_client_close", "idle_reaper"],
        "apache-default": ["ignore_client_close", "idle_reaper"],
        "caddy-default": [],
    }


def pipeline_specs(name: str) -> tuple[FaultSpec, ...]:
    text = f"name: t\npath:\n  - preset: {name}\n"
    return tuple(load_scenario_text(text, REGISTRY, presets=PRESETS).path)


def test_nginx_default_sends_the_head_with_the_first_4_kib_burst_and_the_rest_at_the_end() -> None:
    sent = stream()
    out = replay(pipeline("nginx-default"), sent)
    writes = [i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN]
    assert all(len(w) >= 4096 for w in writes[:-1])
    assert len(writes) == 5  # as the real nginx 1.22 did: 4160, 4104, 4104, 4104, 1899 bytes
    assert writes[0].startswith(b"HTTP/1.1 200 OK")
    filled = next(t for t, _ in sent if len(down_bytes([x for x in sent if x[0] <= t])) >= 4096)
    assert down_times(out)[0] == filled  # the read that fills the first 4 KiB buffer
    assert down_bytes(out) == down_bytes(sent)


def test_nginx_default_closes_a_silent_stream_after_proxy_read_timeout_without_the_last_chunk() -> (
    None
):
    writes = sse_response(*TOKENS[:10], done=False)
    sent = timeline(writes, step=ITL)
    out = replay(pipeline("nginx-default"), sent, until=100.0)
    assert [i for _, i in ends(out)] == [Eof(DOWN), Eof(UP)]
    # nginx's lazy timer (NGX_TIMER_LAZY_DELAY 300 ms): the 220 ms of frames after the
    # request never moved it, so it fires 60 s after the request, not after the last frame
    assert sent[-1][0] < 0.3
    assert [t for t, _ in ends(out)] == pytest.approx([60.0, 60.0])
    ((body, complete),) = dechunked(down_bytes(out))
    assert not complete and b"[DONE]" not in body


def test_nginx_streaming_passes_every_write_when_it_comes() -> None:
    sent = stream()
    out = replay(pipeline("nginx-streaming"), sent)
    assert down_times(out) == [t for t, i in sent if i.direction is DOWN]


def test_nginx_gzip_holds_the_whole_compressed_stream_until_the_end() -> None:
    sent = stream()
    out = replay(pipeline("nginx-gzip"), sent)
    wire = down_bytes(out)
    assert set(down_times(out)) == {sent[-1][0]}  # one burst, when the upstream ended
    head, _, _ = wire.partition(b"\r\n\r\n")
    assert b"content-encoding: gzip" in head.lower()
    ((body, complete),) = dechunked(wire)
    assert complete
    assert gzip.decompress(body).count(b"data: ") == 61


def test_haproxy_default_sends_full_segments_of_a_fast_stream() -> None:
    sent = stream()
    out = replay(pipeline("haproxy-default"), sent)
    writes = [i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN]
    assert all(len(w) % 1448 == 0 for w in writes[:-1])  # a corked socket sends full MSS
    assert len(writes) < len(TOKENS) / 3
    assert down_bytes(out) == down_bytes(sent)


def test_haproxy_default_holds_a_slow_stream_for_one_rto_from_the_first_held_byte() -> None:
    sent = timeline(sse_response(*[t[:20] for t in TOKENS[:8]]), step=0.05)
    out = replay(pipeline("haproxy-default"), sent)
    # Linux's probe timer: one RTO, 204 ms on loopback at HZ=250 (faults/presets.py).
    assert down_times(out)[:2] == [pytest.approx(0.05 + 0.204), pytest.approx(0.30 + 0.204)]
    assert down_bytes(out) == down_bytes(sent)


# The grid's pause shapes (calibrate/shapes.py) as the fixed-frame upstream writes them: the
# head, a 256-byte chunk every 20 ms, a 600 ms pause after the 10th (optionally `: keep-alive`
# every 100 ms), each write 1 ms late as a sleeping writer is. Frames fall on a 200 ms grid,
# so they land at the cork's edge: what HAProxy 2.6 sent there (docs/calibration.md).
LATE = 0.001
FRAME_250 = encode_chunk(b"data: " + b"z" * 242 + b"\n\n")
COMMENT = encode_chunk(b": keep-alive\n\n")


def pause_shape(comments: bool, frames: int = 20) -> list[TimedItem]:
    sent: list[TimedItem] = [(0.0, Chunk(UP, REQUEST)), (LATE, Chunk(DOWN, SSE_HEAD))]
    sent += [(0.02 * i + LATE, Chunk(DOWN, FRAME_250)) for i in range(1, 11)]
    if comments:
        sent += [(0.2 + 0.1 * i + LATE, Chunk(DOWN, COMMENT)) for i in range(1, 6)]
    sent += [(0.8 + 0.02 * i + LATE, Chunk(DOWN, FRAME_250)) for i in range(1, frames - 9)]
    return sent


def loopback_haproxy() -> Pipeline:
    """haproxy-default on loopback: the shell hands `segment: auto` the link's MSS."""
    import random

    from middlebox.core.fault import FaultContext

    chain = pipeline("haproxy-default")
    chain.bind(FaultContext(rng=random.Random(0)))
    chain.set_client_mss(65483)
    return chain


def down_writes(output: list[TimedItem]) -> list[tuple[float, int]]:
    return [(t, len(i.data)) for t, i in output if isinstance(i, Chunk) and i.direction is DOWN]


def test_haproxy_default_sends_the_frames_before_a_pause_in_one_burst() -> None:
    # The 10th frame comes 201 ms after the head: inside the kernel's 204 ms, so it joins
    # the head's segment (HAProxy: 2655 bytes at 0.204 s); a 200 ms window sent it alone.
    out = replay(loopback_haproxy(), pause_shape(comments=False), bind=False)
    head_and_ten = len(SSE_HEAD) + 10 * len(FRAME_250)
    assert down_writes(out)[0] == (pytest.approx(LATE + 0.204), head_and_ten)
    assert down_times(out)[1] == pytest.approx(0.821 + 0.204)  # next: after the pause


def test_haproxy_default_holds_keep_alive_comments_one_rto_from_the_first() -> None:
    # Comments at 0.301, 0.401, 0.501: the third is inside 0.301 + 204 ms, so three go
    # together; then 0.601 and 0.701 (HAProxy: 57 bytes at 0.507 s, 38 at 0.811 s).
    out = replay(loopback_haproxy(), pause_shape(comments=True), bind=False)
    assert down_writes(out)[1:3] == [
        (pytest.approx(0.301 + 0.204), 3 * len(COMMENT)),
        (pytest.approx(0.601 + 0.204), 2 * len(COMMENT)),
    ]


def test_haproxy_default_holds_the_first_write_after_a_pause_again() -> None:
    # Nothing is held through the pause; the first frame after it starts a new cork of
    # one RTO (HAProxy: 1.028 s), taking the frames that come within it.
    sent = pause_shape(comments=False)
    out = replay(loopback_haproxy(), sent, bind=False)
    after = [(t, n) for t, n in down_writes(out) if t > 0.3]
    assert after[0] == (pytest.approx(0.821 + 0.204), 10 * len(FRAME_250))
    assert down_bytes(out) == down_bytes(sent)


def test_haproxy_default_sends_two_frames_a_cork_off_the_200ms_grid() -> None:
    # The grid's 250B-170ms (calibrate/shapes.py): each cork takes the frame 170 ms after
    # its first write, 34 ms inside its 204 ms edge; the next frame, 136 ms past it,
    # starts a new cork. No frame sits on the edge, so no coin toss on either side.
    sent: list[TimedItem] = [(0.0, Chunk(UP, REQUEST)), (LATE, Chunk(DOWN, SSE_HEAD))]
    sent += [(0.17 * i + LATE, Chunk(DOWN, FRAME_250)) for i in range(1, 12)]
    out = replay(loopback_haproxy(), sent, bind=False)
    writes = down_writes(out)
    assert writes[0] == (pytest.approx(LATE + 0.204), len(SSE_HEAD) + len(FRAME_250))
    assert writes[1:6] == [
        (pytest.approx(0.17 * i + LATE + 0.204), 2 * len(FRAME_250)) for i in (2, 4, 6, 8, 10)
    ]
    assert down_bytes(out) == down_bytes(sent)


def test_haproxy_default_learns_the_client_left_when_a_write_after_the_cork_fails() -> None:
    sent = [*stream()[:11], (11 * ITL + 0.001, Eof(UP)), *stream()[11:]]
    out = replay(pipeline("haproxy-default"), sent)
    (when, _), *_ = [(t, i) for t, i in out if isinstance(i, Reset) and i.direction is UP]
    # The first write after the FIN (12 x ITL) is corked 204 ms; the write at 12 x ITL +
    # 200 ms still joins it (a 200 ms cork failed that one, a frame early); the next fails.
    assert when == pytest.approx(23 * ITL)  # measured: 224-235 ms after the FIN, 12 tokens


def test_apache_default_flushes_each_write_and_learns_at_the_second_write_after_a_fin() -> None:
    sent = [*stream()[:11], (11 * ITL + 0.001, Eof(UP)), *stream()[11:]]
    out = replay(pipeline("apache-default"), sent)
    assert down_times(out) == [t for t, i in sent if i.direction is DOWN and t < 11 * ITL + 0.001]
    resets = [t for t, i in out if isinstance(i, Reset) and i.direction is UP]
    assert resets == [pytest.approx(13 * ITL)]  # measured: 38 ms, 2 tokens


def test_caddy_default_and_nginx_pass_the_clients_close_to_the_upstream_at_once() -> None:
    for name in ("caddy-default", "nginx-default", "nginx-streaming"):
        sent = [*stream()[:11], (11 * ITL + 0.001, Eof(UP)), *stream()[11:]]
        out = replay(pipeline(name), sent)
        assert (11 * ITL + 0.001, Eof(UP)) in out, name


@pytest.mark.parametrize(
    ("name", "timeout"), [("haproxy-default", 50.0), ("apache-default", 300.0)]
)
def test_the_default_read_timeout_ends_a_silent_stream_without_the_last_chunk(
    name: str, timeout: float
) -> None:
    sent = timeline(sse_response(*TOKENS[:10], done=False), step=ITL)
    out = replay(pipeline(name), sent, until=1000.0)
    assert [t for t, i in ends(out) if i == Eof(DOWN)] == [pytest.approx(sent[-1][0] + timeout)]
    ((body, complete),) = dechunked(down_bytes(out))
    assert not complete and body.count(b"data: ") == 10


# The calibration's own measures (calibrate/compare.py, calibrate/probe.py): the verdicts of
# `make calibrate` are only as good as these.


def reads(times: list[float], pieces: list[bytes], end: str = "eof") -> Reads:
    out = Reads(sent_at=0.0, times=times, sizes=[len(p) for p in pieces], end=end)
    out.data += b"".join(pieces)
    return out


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices":[{"text":"a"}]}\n\n'
DONE = b"data: [DONE]\n\n"


def test_reads_closer_than_10_ms_are_one_burst() -> None:
    seen = reads([0.0, 0.005, 0.020, 0.021, 0.5], [b"a", b"bb", b"ccc", b"dddd", b"e"])
    assert bursts(seen) == [3, 7, 1]
    assert largest_gap(seen) == pytest.approx(0.479)


@pytest.mark.parametrize(
    ("pieces", "end", "kind"),
    [
        ([HEAD, encode_chunk(EVENT), encode_chunk(DONE), LAST_CHUNK_BYTES], "complete", "complete"),
        ([HEAD, encode_chunk(EVENT), LAST_CHUNK_BYTES], "complete", "fin-no-done"),
        ([HEAD, encode_chunk(EVENT)], "eof", "truncated"),
        ([HEAD, encode_chunk(EVENT)], "reset", "reset"),
        ([HEAD], "timeout", "hang"),
        ([b"HTTP/1.0 200 OK\r\n\r\n", EVENT, DONE], "eof", "complete"),
        ([b"HTTP/1.1 504 Gateway Time-out\r\ncontent-length: 3\r\n\r\nbye"], "complete",
         "504 fin-no-done"),
    ],
)  # fmt: skip
def test_the_end_kind_is_what_a_client_library_would_conclude(
    pieces: list[bytes], end: str, kind: str
) -> None:
    seen = reads([0.1 * i for i in range(len(pieces))], pieces, end)
    assert end_kind(seen, decode(seen)) == kind


def test_a_gzipped_event_counts_when_it_can_be_inflated_not_when_its_bytes_arrive() -> None:
    deflater = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    held = deflater.compress(EVENT * 3)  # zlib keeps it: nothing decodable yet
    tail = deflater.flush()
    head = HEAD.replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip\r\n\r\n")
    pieces = [head, encode_chunk(held) if held else b"", encode_chunk(tail) + LAST_CHUNK_BYTES]
    seen = reads([0.0, 0.1, 0.9], pieces)
    decoded = decode(seen)
    assert decoded.gzip and decoded.first_event_at == 0.9 and decoded.tokens == 3


def test_a_tolerance_takes_the_larger_of_its_absolute_and_relative_parts() -> None:
    tolerance = Tolerance(0.05, 0.20)
    assert tolerance.accepts(1.0, 1.19) and not tolerance.accepts(1.0, 1.21)
    assert tolerance.accepts(0.01, 0.06) and not tolerance.accepts(0.01, 0.07)


def test_never_agrees_only_with_never() -> None:
    rows = {row.measure: row.ok for row in compare("p", {"abandon_latency": None},
                                                    {"abandon_latency": 0.2})}  # fmt: skip
    assert rows["abandon_latency"] is False
    rows = {row.measure: row.ok for row in compare("p", {"abandon_latency": None},
                                                    {"abandon_latency": None})}  # fmt: skip
    assert rows["abandon_latency"] is True


def test_calibration_overrides_only_the_idle_timeout_and_the_segment_size() -> None:
    path = preset_path("haproxy-default", mss=65483, idle_timeout=1.0)
    assert path == [
        # segment: auto reads the link's MSS itself, so the preset is measured as shipped.
        {
            "coalescer": {
                "direction": "downstream",
                "window": "204ms",
                "size": 1448,
                "segment": "auto",
            }
        },
        {"ignore_client_close": {"until": "write_fails", "cork": "204ms"}},
        {"idle_reaper": {"timeout": "1000ms", "before_headers": "504", "after_headers": "close"}},
    ]


CLOSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
SMALL = b"data: " + b"y" * 22 + b"\n\n"  # a 30-byte frame: single-character completions


def close_delimited(frames: int, *, step: float = ITL) -> list[TimedItem]:
    """What vLLM answers nginx's HTTP/1.0 request: no chunking, the end is the FIN."""
    return timeline([CLOSE_HEAD, *[SMALL] * frames], step=step)


def test_nginx_default_asks_the_upstream_in_http_1_0_with_connection_close() -> None:
    out = replay(pipeline("nginx-default"), stream()[:1])
    sent = b"".join(i.data for _, i in out if isinstance(i, Chunk) and i.direction is UP)
    assert sent.startswith(b"POST /v1/chat/completions HTTP/1.0\r\n")
    assert b"Connection: close\r\n" in sent


def test_nginx_default_counts_body_bytes_so_30_byte_frames_fill_4k_at_the_136th() -> None:
    out = replay(pipeline("nginx-default"), [*close_delimited(200), (5.0, Eof(DOWN))])
    # 71 + 134 x 30 = 4091 < 4096 <= 71 + 135 x 30: the 135th frame (at 2.72 s) fills it.
    # Counting 6 bytes of chunk framing per frame would have filled it at the 113th.
    first = next(t for t, i in out if isinstance(i, Chunk) and i.direction is DOWN)
    assert first == pytest.approx(ITL * 136)
    assert dechunked(down_bytes(out)) == [(SMALL * 200, True)]


def test_nginx_default_read_timeout_drops_the_partial_buffer() -> None:
    out = replay(pipeline("nginx-default"), close_delimited(200), until=200.0)
    wire = down_bytes(out)
    assert not wire.endswith(LAST_CHUNK_BYTES)
    # The client got the full 4 KiB slab only (head + 4025 body bytes), and the FIN 60 s
    # after the timer's last move: nginx moves it only by 300 ms or more (lazy timers).
    [(body, complete)] = dechunked(wire)
    assert (len(body), complete) == (4096 - len(CLOSE_HEAD), False)
    ((end_time, end),) = [(t, i) for t, i in out if isinstance(i, Eof) and i.direction is DOWN]
    moved = 0.0
    for when, item in close_delimited(200):
        if item.direction is DOWN and when - moved >= 0.3 - 1e-9:
            moved = when
    assert ITL * 201 - 0.3 < moved <= ITL * 201
    assert end == Eof(DOWN) and end_time == pytest.approx(moved + 60.0)


def test_nginx_gzip_read_timeout_flushes_a_gzip_200_without_the_terminal_chunk() -> None:
    out = replay(pipeline("nginx-gzip"), close_delimited(200), until=200.0)
    wire = down_bytes(out)
    assert wire.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Encoding: gzip" in wire
    assert not wire.endswith(LAST_CHUNK_BYTES)
    [(body, complete)] = dechunked(wire)
    text = zlib.decompressobj(wbits=31).decompress(body)
    # The full slab's body bytes, decodable, and not the dropped partial buffer.
    assert (text, complete) == ((SMALL * 200)[: 4096 - len(CLOSE_HEAD)], False)


def test_apache_answers_a_timeout_before_the_head_with_502() -> None:
    out = replay(pipeline("apache-default"), stream()[:1], until=400.0)
    page = b"".join(i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN)
    assert page.startswith(b"HTTP/1.1 502 ")
    assert [t for t, i in out if isinstance(i, Eof) and i.direction is DOWN] == [300.0]
