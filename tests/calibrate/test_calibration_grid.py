"""The calibration's stream-shape grid (calibrate/shapes.py, calibrate/grid.py): the shapes
are what they say (exact frame sizes, heartbeats, HTTP/1.0 close-delimited vs chunked),
the fixed-frame upstream learns of a FIN and of an RST and stops, and the grid's rows and
table judge every measure. Loopback only, bounded; no timing is asserted."""

from __future__ import annotations

import json
import socket

import pytest

from calibrate import compare, probe, suite
from calibrate.grid import (
    compare_grid,
    least_disturbed,
    measure_shape,
    render_grid,
    request_delay,
    retake,
    settled_entry,
    worst_lateness,
)
from calibrate.probe import Reads
from calibrate.shapes import (
    FRAME_OVERHEAD,
    GRID,
    SHAPES,
    FixedUpstream,
    Shape,
    prompt_for,
)
from middlebox.scenario.probe_shape import PROMPT_MARK, parse_knobs, plan

TINY = Shape("tiny", frame_bytes=30, period=0.001, frames=12)


@pytest.mark.parametrize("shape", GRID, ids=lambda s: s.name)
def test_every_frame_of_every_grid_shape_is_exactly_its_size(shape: Shape) -> None:
    frames = [shape.frame(i) for i in range(shape.frames)]
    assert {len(f) for f in frames} == {shape.frame_bytes}
    assert len(set(frames)) == shape.frames  # numbered: no two alike
    assert all(f.startswith(b'data: {"text":"') and f.endswith(b'"}\n\n') for f in frames)


def test_the_grid_spans_the_shapes_the_issue_names() -> None:
    sizes = {s.frame_bytes for s in GRID}
    periods = {s.period for s in GRID}
    assert min(sizes) <= 30 and max(sizes) >= 1024
    assert min(periods) <= 0.010 and max(periods) >= 0.100
    assert any(s.pause_before_head for s in GRID)
    assert any(s.pause_after and s.heartbeat for s in GRID)
    assert any(s.pause_after and not s.heartbeat for s in GRID)
    assert {s.cancel for s in GRID} == {None, "fin", "rst"}


def test_a_shape_refuses_what_it_cannot_play() -> None:
    with pytest.raises(ValueError, match="at least"):
        Shape("x", frame_bytes=FRAME_OVERHEAD - 1, period=0.01, frames=1)
    with pytest.raises(ValueError, match="go together"):
        Shape("x", frame_bytes=40, period=0.01, frames=1, cancel="fin")
    with pytest.raises(ValueError, match="'fin' or 'rst'"):
        Shape("x", frame_bytes=40, period=0.01, frames=1, cancel="close", cancel_after=1)


def test_prompts_carry_the_shapes_knobs_and_a_tag() -> None:
    shape = SHAPES["pause-600ms-comments"]
    prompt = prompt_for(shape, "nginx-real")
    assert prompt.startswith(PROMPT_MARK)
    knobs = parse_knobs(prompt[len(PROMPT_MARK) :])
    assert (knobs.id, knobs.frames, knobs.size, knobs.format) == ("nginx-real", 40, 250, "text")
    played = plan(knobs, http10=True, ident="nginx-real", model="m")
    frames = [w for w in played.writes if w.kind == "frame"]
    assert [w.data for w in frames] == [shape.frame(i) for i in range(shape.frames)]
    # the 600 ms pause after the 10th frame, `: keep-alive` every 100 ms within it
    assert frames[10].at - frames[9].at == pytest.approx(0.6 + shape.period)
    assert sum(w.kind == "heartbeat" for w in played.writes) == 5


def raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def completion(shape: Shape, tag: str, version: str = "1.1") -> bytes:
    body = b'{"prompt": "%s"}' % prompt_for(shape, tag).encode()
    # the probe upstream keeps an HTTP/1.1 connection alive; this reader reads to its close
    return (
        f"POST /v1/completions HTTP/{version}\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_the_fixed_upstream_answers_http10_close_delimited_and_http11_chunked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(SHAPES, TINY.name, TINY)
    with FixedUpstream() as upstream:
        old = raw_exchange(upstream.port, completion(TINY, "old", "1.0"))
        new = raw_exchange(upstream.port, completion(TINY, "new"))
        assert upstream.ledger("old")["finished_at"] and upstream.ledger("new")["finished_at"]
        assert len(upstream.ledger("new")["token_times"]) == TINY.frames
        unknown = raw_exchange(upstream.port, completion(Shape("nope", 40, 0.01, 1), "x y"))
    head, _, body = old.partition(b"\r\n\r\n")
    assert b"connection: close" in head and b"transfer-encoding" not in head
    assert body == b"".join(TINY.frame(i) for i in range(TINY.frames)) + b"data: [DONE]\n\n"
    head, _, body = new.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body.startswith(b"1e\r\n" + TINY.frame(0) + b"\r\n") and body.endswith(b"\r\n0\r\n\r\n")
    assert unknown.startswith(b"HTTP/1.1 400") and b"probe knob id=x y" in unknown


def test_heartbeats_fill_a_pause_and_count_as_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    beating = Shape("beats", 40, 0.001, 4, pause_after=2, pause=0.05, heartbeat=0.01)
    monkeypatch.setitem(SHAPES, beating.name, beating)
    with FixedUpstream() as upstream:
        port = upstream.port
        reads = probe.stream(port, beating.frames, limit=10, prompt=prompt_for(beating, "b"))
    decoded = probe.decode(reads)
    assert decoded.tokens == 4 and decoded.done and decoded.message_complete
    assert decoded.text.count(": keep-alive\n\n") >= 2


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_the_fixed_upstream_learns_the_client_left_and_stops(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # played directly (no proxy): the client's close reaches the upstream itself
    cancelling = Shape(f"cancel-{how}", 60, 0.005, 2000, cancel=how, cancel_after=3)
    monkeypatch.setitem(SHAPES, cancelling.name, cancelling)
    with FixedUpstream() as upstream:
        measured = measure_shape(upstream.port, upstream, cancelling, how)
        entry = settled_entry(upstream, how)
    assert measured["client"] == "abandoned" and measured["client_tokens"] >= 3
    assert entry["disconnected_at"] and not entry["finished_at"]
    assert len(entry["token_times"]) < cancelling.frames  # it stopped
    assert measured["abandon_latency"] is not None


def test_the_grid_judges_each_shape_and_marks_a_disagreement() -> None:
    real = {
        "250B-20ms": {"first_byte": 0.010, "bursts": 60, "stream_end": "complete", "tokens": 60},
        "cancel-fin": {"abandon_latency": 0.01, "abandon_tokens": 0, "client": "abandoned"},
    }
    mine = {
        "250B-20ms": {"first_byte": 0.012, "bursts": 20, "stream_end": "complete", "tokens": 60},
        "cancel-fin": {"abandon_latency": 0.02, "abandon_tokens": 1, "client": "abandoned"},
    }
    rows = compare_grid("nginx-default", real, mine)
    by = {(r.preset, r.measure): r for r in rows}
    assert by[("nginx-default @ 250B-20ms", "first_byte")].ok
    assert not by[("nginx-default @ 250B-20ms", "bursts")].ok  # 20 vs 60: beyond ±20%
    assert by[("nginx-default @ 250B-20ms", "tokens")].ok  # judged: identical
    assert by[("nginx-default @ cancel-fin", "client")].ok
    table = render_grid(rows)
    lines = table.splitlines()
    assert lines[0].startswith("| preset @ shape | first byte |")
    assert "| nginx-default @ 250B-20ms | 0.010 / 0.012 |" in table
    assert "**60 / 20 ✗**" in table and lines[2].endswith("| NO |")
    assert lines[3].endswith("| yes |")


def test_a_wider_burst_gap_keeps_10ms_frames_apart() -> None:
    # frames every 10 ms, read at 9.6-10.4 ms: BURST_GAP (10 ms) tosses a coin per gap;
    # half the period does not
    times = [i * 0.010 + (0.0004 if i % 2 else -0.0004) for i in range(1, 11)]
    seen = Reads(sent_at=0.0, times=times, sizes=[30] * 10)
    assert len(compare.bursts(seen)) < 10
    assert len(compare.bursts(seen, gap=0.005)) == 10


def _completion(text: str, tokens: int) -> bytes:
    chunk = {"choices": [{"index": 0, "text": text}], "usage": {"completion_tokens": tokens}}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def test_the_idle_measure_counts_tokens_from_usage_when_the_upstream_merged_frames() -> None:
    # Tokens 1-8 one per frame, then 9 and 10 merged into one frame by a late writer, then
    # half of an 11th event: 9 whole events but 10 tokens; the cut event does not count.
    frames = [_completion(f"t{i}", i) for i in range(1, 9)] + [_completion("t9t10", 10)]
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    body = head + b"".join(frames) + _completion("t11", 11)[:20]
    reads = Reads(sent_at=0.0, times=[0.1], sizes=[len(body)], data=bytearray(body), end="eof")
    decoded = probe.decode(reads)
    assert (decoded.tokens, decoded.usage_tokens) == (9, 10)
    assert b'"continuous_usage_stats": true' in probe.request_bytes(1, 60, "idle", usage=True)
    assert b"stream_options" not in probe.request_bytes(1, 60, "idle")


def test_an_upstream_without_usage_leaves_the_event_count() -> None:
    event = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
    body = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(event), event)
    reads = Reads(sent_at=0.0, times=[0.1], sizes=[len(body)], data=bytearray(body), end="eof")
    decoded = probe.decode(reads)
    assert (decoded.tokens, decoded.usage_tokens, decoded.message_complete) == (1, None, True)


def test_of_two_emulator_takes_the_one_whose_tokens_came_on_time_counts() -> None:
    stalled = {"stream_end": "complete", "largest_gap": 0.343, "tokens": 60,
               "upstream_lateness": 0.240}  # fmt: skip
    clean = {"stream_end": "complete", "largest_gap": 0.104, "tokens": 60,
             "upstream_lateness": 0.003}  # fmt: skip
    assert suite.least_disturbed([stalled, clean]) is clean
    assert suite.least_disturbed([clean, stalled]) is clean
    assert suite.STREAM_TAKES == 2


def test_the_emulators_lateness_is_its_latest_token_against_its_schedule() -> None:
    on_time = [10.1 + i * suite.ITL for i in range(5)]
    entry = {"received_at": 10.0, "prompt_tokens": 0, "token_times": on_time}
    assert suite.schedule_lateness(entry) == pytest.approx(0.0, abs=1e-9)
    # a 120 ms stall before the 4th token: it and every later one come 120 ms late
    stalled = [*on_time[:3], *(t + 0.120 for t in on_time[3:])]
    assert suite.schedule_lateness({**entry, "token_times": stalled}) == pytest.approx(0.120)
    # a stall before the first token: every token on time after it, the first 80 ms late
    late_start = [t + 0.080 for t in on_time]
    assert suite.schedule_lateness({**entry, "token_times": late_start}) == pytest.approx(0.080)
    # the prefill grows with the prompt (0.2 ms a token): 50 prompt tokens, 10 ms later
    long_prompt = {**entry, "prompt_tokens": 50, "token_times": [t + 0.010 for t in on_time]}
    assert suite.schedule_lateness(long_prompt) == pytest.approx(0.0, abs=1e-9)
    assert suite.schedule_lateness({}) == 0.0


def test_only_a_disagreeing_shape_is_taken_again() -> None:
    stream_shape, cancel_shape = SHAPES["250B-20ms"], SHAPES["cancel-fin"]
    real = {"250B-20ms": {"bursts": 60}, "cancel-fin": {"abandon_tokens": 0}}
    mine = {"250B-20ms": {"bursts": 40}, "cancel-fin": {"abandon_tokens": 9}}
    rows = compare_grid("p", real, mine)
    assert retake([stream_shape, cancel_shape], rows) == [stream_shape, cancel_shape]
    agreeing = compare_grid("p", real, {**mine, "250B-20ms": {"bursts": 60}})
    assert retake([stream_shape, cancel_shape], agreeing) == [cancel_shape]
    assert retake([stream_shape, cancel_shape], compare_grid("p", real, real)) == []


def stream_take(gap: float, lateness: float, tokens: int = 40) -> dict[str, object]:
    return {"stream_end": "complete", "largest_gap": gap, "tokens": tokens,
            "upstream_lateness": lateness}  # fmt: skip


def test_the_take_whose_upstream_ran_on_schedule_counts_not_the_smaller_gap() -> None:
    # pause-600ms through HAProxy (run 4): a 10th frame written 6 ms late missed the
    # cork's 204 ms and went alone, which made the largest gap *smaller* (0.616 s); the
    # on-time take sent it with the head (0.821 s). The on-time take counts.
    split_by_a_late_frame = stream_take(gap=0.616, lateness=0.006)
    on_time = stream_take(gap=0.821, lateness=0.0004)
    assert least_disturbed(split_by_a_late_frame, on_time) == {**on_time, "takes": 2}
    assert least_disturbed(on_time, split_by_a_late_frame) == {**on_time, "takes": 2}
    # a stall of the pass-through Caddy: the late take, whatever its gap
    assert least_disturbed(stream_take(0.186, 0.150), stream_take(0.039, 0.002))[
        "largest_gap"
    ] == pytest.approx(0.039)


def test_a_request_that_reached_the_upstream_late_marks_a_disturbed_take() -> None:
    # run 1: the preset's first byte on haproxy 1KB-10ms came 80 ms late with the same 20
    # frames in its first burst: the proxy process forwarded the request late, which the
    # upstream's write clock cannot see
    reads = Reads(sent_at=100.0)
    assert request_delay(reads, {"received_at": 100.080}) == pytest.approx(0.080)
    assert request_delay(reads, {}) == 0.0
    woken_late = {**stream_take(gap=0.2, lateness=0.001), "request_delay": 0.080}
    prompt = {**stream_take(gap=0.2, lateness=0.008), "request_delay": 0.002}
    assert least_disturbed(woken_late, prompt) == {**prompt, "takes": 2}


def test_a_take_that_lost_the_stream_is_not_the_cleaner_one_for_its_quiet_upstream() -> None:
    lost = stream_take(gap=0.0, lateness=0.0, tokens=0)
    late = stream_take(gap=0.3, lateness=0.2)
    assert least_disturbed(lost, late) == {**late, "takes": 2}


def test_a_cancelling_take_counts_the_clients_lateness_and_the_upstreams() -> None:
    # the client closed 200 ms after its last read, onto the next corked burst
    late_client = {"abandon_latency": 0.006, "abandon_tokens": 1, "client_delay": 0.2,
                   "upstream_lateness": 0.001}  # fmt: skip
    prompt = {"abandon_latency": 0.24, "abandon_tokens": 12, "client_delay": 0.001,
              "upstream_lateness": 0.002}  # fmt: skip
    assert least_disturbed(late_client, prompt) == {**prompt, "takes": 2}
    late_upstream = {**prompt, "upstream_lateness": 0.3}
    assert least_disturbed(late_upstream, late_client) == {**late_client, "takes": 2}
    rows = compare_grid("p", {"s": {"bursts": 60}}, {"s": {"bursts": 60}})
    assert "| p @ s (2 takes) |" in render_grid(rows, frozenset({"p @ s"}))
    assert "| p @ s |" in render_grid(rows)


def test_the_fixed_upstream_records_how_late_each_write_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beating = Shape("beats-late", 40, 0.002, 4, pause_after=2, pause=0.05, heartbeat=0.01)
    monkeypatch.setitem(SHAPES, beating.name, beating)
    with FixedUpstream() as upstream:
        measured = measure_shape(upstream.port, upstream, beating, "late")
        entry = upstream.ledger("late")
    # the head, 4 frames, 4 heartbeats (at 10-40 ms of the 50 ms pause), [DONE], the
    # terminal chunk: one lateness each, none negative
    assert len(entry["lateness"]) == 1 + 4 + 4 + 2
    assert min(entry["lateness"]) >= 0.0
    assert measured["upstream_lateness"] == max(entry["lateness"])
    assert 0.0 <= measured["request_delay"] < 5.0 and entry["received_at"] > 0
    assert worst_lateness({}) == 0.0


def test_the_single_shape_abandon_is_taken_again_only_when_it_disagrees() -> None:
    real = {"abandon_latency": 0.268, "abandon_tokens": 14, "client": "abandoned",
            "client_delay": 0.001, "upstream_lateness": 0.09, "bursts": 6}  # fmt: skip
    mine = {**real, "abandon_latency": 0.359, "abandon_tokens": 18, "upstream_lateness": 0.002}
    asked: list[str] = []

    def again(side: str) -> dict[str, object]:
        asked.append(side)
        return {"abandon_latency": 0.233, "abandon_tokens": 12, "client": "abandoned",
                "client_delay": 0.001, "upstream_lateness": 0.003}  # fmt: skip

    retaken = suite.retake_abandon("haproxy-default", real, mine, again)
    assert asked == ["real", "preset"]
    assert retaken is not None
    kept_real, kept_mine = retaken
    # the real side's first take ran 90 ms late: its second counts; the preset's first
    # ran closer to schedule than its second: it keeps its first
    assert (kept_real["abandon_latency"], kept_real["abandon_takes"]) == (0.233, 2)
    assert (kept_mine["abandon_latency"], kept_mine["abandon_takes"]) == (0.359, 2)
    assert "bursts" not in kept_real  # only the abandon measures are replaced
    asked.clear()
    assert suite.retake_abandon("haproxy-default", real, real, again) is None
    assert asked == []
    rows = suite.marked(compare.compare("haproxy-default", kept_real, kept_mine), kept_real)
    labels = {row.measure: row.preset for row in rows}
    assert labels["abandon_latency"] == "haproxy-default (2 takes)"
    assert labels["client"] == "haproxy-default (2 takes)"


def test_one_grid_shape_keeps_its_frames_off_the_corks_200ms_edge() -> None:
    cork = 0.204  # haproxy-default's window (faults/presets.py)
    off = [s for s in GRID if s.cancel is None and s.pause_after is None
           and round(0.2 / s.period, 6) % 1]  # fmt: skip
    assert [s.name for s in off] == ["250B-170ms"]
    (period,) = [s.period for s in off]
    # a cork starts at a write and takes the next frame `period` later, 34 ms inside its
    # edge; the frame after that comes 136 ms past the edge and starts the next cork
    assert cork - period > 0.03 and 2 * period - cork > 0.03


def test_a_cancelling_clients_delay_is_from_its_last_read_to_its_close() -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    reads = Reads(sent_at=0.0, times=[0.1, 0.3], sizes=[len(head), 0], data=bytearray(head))
    reads.end, reads.ended_at, reads.closed_wall = "abandoned", 0.35, 1.0
    measured = compare.abandon_measures(reads, probe.decode(reads), {"token_times": [1.1]})
    assert measured["client_delay"] == pytest.approx(0.05)
    assert measured["abandon_tokens"] == 1
