"""The probe upstream's shapes (middlebox/scenario/probe_shape.py): knobs parse to a shape
and back, each knob changes the plan exactly as it says (frame sizes, due seconds, the
pause and its comments, the end, the framing), a bad knob is a one-line error naming it,
and a request's knobs are found in the header, the body's field or the prompt, in that
order. Pure: no socket, no clock."""

from __future__ import annotations

import json

import pytest

from faults.latency import Latency
from faults.testing import replay
from middlebox.core.stream import DOWN, Chunk, Eof, Reset
from middlebox.scenario.probe_shape import (
    DONE,
    HEARTBEAT,
    LAST_CHUNK,
    PROMPT_MARK,
    ProbeShape,
    ProbeSpecError,
    Write,
    frame,
    knobs_in_request,
    parse_knobs,
    plan,
    request_for,
    smallest_frame,
    timeline,
)


def frames_of(writes: tuple[Write, ...]) -> list[Write]:
    return [w for w in writes if w.kind == "frame"]


def dechunk(data: bytes) -> bytes:
    size, _, rest = data.partition(b"\r\n")
    assert rest.endswith(b"\r\n") and len(rest) == int(size, 16) + 2
    return rest[:-2]


@pytest.mark.parametrize("fmt", ["chat", "completion", "text"])
def test_every_frame_is_exactly_its_size_and_parses_as_the_formats_json(fmt: str) -> None:
    shape = parse_knobs(f"frames=30;size=300;format={fmt};id=abc")
    played = plan(shape, http10=True, ident="abc", model="my/model")
    frames = [w.data for w in frames_of(played.writes)]
    assert {len(f) for f in frames} == {300} and len(set(frames)) == 30
    chunk = json.loads(frames[0].removeprefix(b"data: ").rstrip(b"\n"))
    if fmt == "chat":
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == "chatcmpl-abc"
        assert chunk["model"] == "my/model" and len(chunk["choices"][0]["delta"]["content"]) > 0
    elif fmt == "completion":
        assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"]
    else:
        assert list(chunk) == ["text"]


def test_frame_k_is_due_head_delay_plus_k_periods() -> None:
    played = plan(parse_knobs("frames=5;period=40ms;head_delay=800ms"), http10=False,
                  ident="x", model="m")  # fmt: skip
    head, *rest = played.writes
    assert (head.kind, head.at) == ("head", pytest.approx(0.8))
    assert [w.at for w in frames_of(played.writes)] == [
        pytest.approx(0.8 + 0.04 * k) for k in range(1, 6)
    ]
    assert [w.index for w in frames_of(played.writes)] == [0, 1, 2, 3, 4]
    assert [w.kind for w in rest[-2:]] == ["done", "last-chunk"]
    assert rest[-1].at == pytest.approx(1.0) and played.end_at == pytest.approx(1.0)


def test_a_pause_after_frame_n_shifts_the_rest_and_is_filled_with_comments_if_asked() -> None:
    quiet = plan(parse_knobs("frames=4;period=10ms;pause_after=2;pause=500ms;format=text"),
                 http10=True, ident="x", model="m")  # fmt: skip
    times = [w.at for w in frames_of(quiet.writes)]
    assert times == [pytest.approx(t) for t in (0.01, 0.02, 0.53, 0.54)]
    assert not [w for w in quiet.writes if w.kind == "heartbeat"]
    beating = plan(
        parse_knobs("frames=4;period=10ms;pause_after=2;pause=500ms;heartbeat=100ms;format=text"),
        http10=True, ident="x", model="m",
    )  # fmt: skip
    beats = [w for w in beating.writes if w.kind == "heartbeat"]
    # every 100 ms from the 2nd frame; none within 1 ms of the pause's end (0.52 s)
    assert [b.at for b in beats] == [pytest.approx(t) for t in (0.12, 0.22, 0.32, 0.42)]
    assert {b.data for b in beats} == {HEARTBEAT}
    assert [w.at for w in frames_of(beating.writes)] == times


def test_a_pause_after_frame_zero_is_a_pause_after_the_head() -> None:
    played = plan(parse_knobs("frames=2;period=10ms;pause_after=0;pause=2s"), http10=False,
                  ident="x", model="m")  # fmt: skip
    assert played.writes[0].at == 0.0
    assert [w.at for w in frames_of(played.writes)] == [pytest.approx(2.01), pytest.approx(2.02)]


@pytest.mark.parametrize(
    ("end", "tail", "keep_alive"),
    [
        ("done", ["done", "last-chunk"], True),
        ("clean", ["last-chunk"], True),
        ("fin", [], False),
        ("rst", [], False),
    ],
)
def test_each_end_writes_what_it_says_over_chunks(
    end: str, tail: list[str], keep_alive: bool
) -> None:
    played = plan(parse_knobs(f"frames=3;end={end}"), http10=False, ident="x", model="m")
    kinds = [w.kind for w in played.writes]
    assert kinds == ["head", "frame", "frame", "frame", *tail]
    assert played.end == end and played.keep_alive is keep_alive
    if "done" in tail:
        assert dechunk(played.writes[4].data) == DONE
    if "last-chunk" in tail:
        assert played.writes[-1].data == LAST_CHUNK
    assert b"transfer-encoding: chunked" in played.writes[0].data
    assert all(dechunk(w.data) for w in played.writes[1:4])


def test_an_http10_request_gets_a_close_delimited_body() -> None:
    played = plan(parse_knobs("frames=2;format=text;size=40"), http10=True, ident="x", model="m")
    head = played.writes[0].data
    assert head == (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"connection: close\r\n\r\n"
    )
    assert played.framing == "close" and not played.keep_alive
    assert b"".join(w.data for w in played.writes[1:]) == frame(0, 40) + frame(1, 40) + DONE
    with pytest.raises(ProbeSpecError, match=r"framing=chunked: this request is HTTP/1\.0"):
        plan(parse_knobs("framing=chunked"), http10=True, ident="x", model="m")


def test_length_framing_declares_the_whole_body_and_a_cut_end_leaves_it_short() -> None:
    done = plan(parse_knobs("frames=3;size=50;format=text;framing=length"), http10=True,
                ident="x", model="m")  # fmt: skip
    body = b"".join(w.data for w in done.writes[1:])
    assert done.content_length == len(body) == 3 * 50 + len(DONE)
    assert b"content-length: %d\r\n" % len(body) in done.writes[0].data
    cut = plan(parse_knobs("frames=3;size=50;format=text;framing=length;end=fin"), http10=True,
               ident="x", model="m")  # fmt: skip
    assert cut.content_length == done.content_length
    assert sum(len(w.data) for w in cut.writes[1:]) == 3 * 50  # [DONE] never comes


def test_header_knobs_go_into_the_head_and_a_connection_close_request_is_answered_so() -> None:
    played = plan(parse_knobs("header=X-Accel-Buffering: no;header=Cache-Control: no-transform"),
                  http10=False, ident="x", model="m", keep_alive=False)  # fmt: skip
    head = played.writes[0].data
    assert b"X-Accel-Buffering: no\r\nCache-Control: no-transform\r\n" in head
    assert head.endswith(b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
    assert not played.keep_alive


def test_retry_comes_after_the_head_and_event_ids_number_the_frames_within_their_size() -> None:
    shape = parse_knobs("frames=12;size=48;format=text;retry=2500ms;event_ids=yes")
    played = plan(shape, http10=True, ident="x", model="m")
    assert [w.kind for w in played.writes[:3]] == ["head", "retry", "frame"]
    assert played.writes[1].data == b"retry: 2500\n\n" and played.writes[1].at == 0.0
    frames = [w.data for w in frames_of(played.writes)]
    assert {len(f) for f in frames} == {48}
    assert frames[0].startswith(b"id: 1\ndata: ") and frames[11].startswith(b"id: 12\ndata: ")
    # the id line of the last (longest) number must fit too
    least = smallest_frame("text", "x", "m", 12)
    with pytest.raises(ProbeSpecError, match=f"a text frame here is at least {least} bytes$"):
        plan(parse_knobs(f"frames=12;size={least - 1};format=text;event_ids=yes"), http10=True,
             ident="x", model="m")  # fmt: skip
    with pytest.raises(ProbeSpecError, match="probe knob event_ids=maybe: expected yes or no"):
        parse_knobs("event_ids=maybe")


def test_knobs_render_back_to_the_same_shape() -> None:
    text = ("frames=7;size=99;period=250ms;head_delay=1.5s;pause_after=3;pause=2s;"
            "heartbeat=300ms;end=rst;framing=length;format=text;on_leave=ignore;retry=3s;"
            "event_ids=yes;header=X-A: 1;id=run-7.a")  # fmt: skip
    shape = parse_knobs(text)
    assert shape.render() == text
    assert parse_knobs(shape.render()) == shape
    assert ProbeShape().render() == ""
    as_object = {"frames": 7, "size": "99", "period": "250ms", "head_delay": "1.5s",
                 "pause_after": 3, "pause": "2s", "heartbeat": "300ms", "end": "rst",
                 "framing": "length", "format": "text", "on_leave": "ignore", "retry": "3s",
                 "event_ids": True,
                 "header": {"X-A": "1"}, "id": "run-7.a"}  # fmt: skip
    assert parse_knobs(as_object) == shape


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ("frames=ten", "probe knob frames=ten: expected a whole number"),
        ("period=50", "probe knob period=50: a duration needs a unit: write 50ms or 50s"),
        ("fram=3", "unknown probe knob 'fram' (knobs: frames, size,"),
        ("frames", "probe knob 'frames' has no '=': write name=value"),
        ("end=close", "probe knob end=close: expected one of done, clean, fin, rst"),
        ("framing=h2", "probe knob framing=h2: expected one of auto, chunked, close, length"),
        ("pause=1s", "probe knob pause: needs pause_after= (the frame it follows)"),
        ("heartbeat=1s", "probe knob heartbeat: sends comments during a pause; set pause="),
        ("frames=2;pause_after=3;pause=1s", "probe knob pause_after=3: the stream has only 2"),
        ("pause_after=1;pause=2h", "probe knob pause=2h: at most 3600s"),
        ("frames=100000;period=1s", "probe shape lasts 100000s: at most 7200s"),
        ("size=2MiB", "probe knob size=2MiB: a frame is at most 1048576 bytes"),
        ("id=a b", "probe knob id=a b: an id is 1-64 letters"),
        ("header=Transfer-Encoding: gzip", "Transfer-Encoding is the probe's own"),
        ("header=no colon", "probe knob header=no colon: expected 'Name: value'"),
        ("frames=1;frames=2", "probe knob frames=2: given twice"),
    ],
)
def test_a_bad_knob_is_one_line_naming_it(knobs: str, message: str) -> None:
    with pytest.raises(ProbeSpecError) as raised:
        parse_knobs(knobs)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_frame_smaller_than_its_format_allows_says_the_least_and_the_way_out() -> None:
    least = smallest_frame("chat", "x", "m")
    with pytest.raises(ProbeSpecError, match=f"at least {least} bytes.*format=text"):
        plan(parse_knobs(f"size={least - 1}"), http10=False, ident="x", model="m")
    smallest = plan(parse_knobs(f"size={least}"), http10=True, ident="x", model="m")
    assert len(frames_of(smallest.writes)[0].data) == least
    assert smallest_frame("text", "", "") == len(b'data: {"text":""}\n\n')


def test_a_requests_knobs_come_from_the_header_then_the_body_then_the_prompt() -> None:
    chat = {"messages": [{"role": "user", "content": f"hello\n{PROMPT_MARK} frames=3"}]}
    assert knobs_in_request("frames=1", {**chat, "middlebox_probe": "frames=2"}) == (
        "header", "frames=1")  # fmt: skip
    assert knobs_in_request(None, {**chat, "middlebox_probe": {"frames": 2}}) == (
        "body", {"frames": 2})  # fmt: skip
    assert knobs_in_request("  ", chat) == ("prompt", " frames=3")
    parts = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"{PROMPT_MARK} frames=4"}]}
        ]
    }
    assert knobs_in_request(None, parts) == ("prompt", " frames=4")
    assert knobs_in_request(None, {"prompt": f"{PROMPT_MARK} end=rst"}) == ("prompt", " end=rst")
    assert knobs_in_request(None, {"messages": [{"role": "user", "content": "hi"}]}) == (
        "default", None)  # fmt: skip
    with pytest.raises(ProbeSpecError, match="middlebox_probe: expected a string"):
        knobs_in_request(None, {"middlebox_probe": 3})


def test_a_plans_timeline_replays_through_a_fault_on_the_virtual_clock() -> None:
    # what a fitter does: the probe's writes through a candidate path, no socket, no sleep
    shape = parse_knobs("frames=4;size=64;period=20ms;format=text;end=fin")
    played = plan(shape, http10=True, ident="v", model="m")
    sent = timeline(played, request_for(shape, host="probe"))
    assert sent[-1] == (pytest.approx(0.08), Eof(DOWN))
    out = replay(Latency(delay=0.1, direction="downstream"), sent)
    down = [(t, i.data) for t, i in out if isinstance(i, Chunk) and i.direction is DOWN]
    assert down == [(pytest.approx(w.at + 0.1), w.data) for w in played.writes]
    assert (pytest.approx(0.18), Eof(DOWN)) in out
    reset = timeline(plan(parse_knobs("frames=1;end=rst"), http10=False, ident="r", model="m"), b"")
    assert reset[-1] == (pytest.approx(0.05), Reset(DOWN))
    kept = timeline(plan(parse_knobs("frames=1"), http10=False, ident="k", model="m"), b"")
    assert isinstance(kept[-1][1], Chunk)  # a kept-alive connection waits for the next request


def test_a_fingerprinters_request_carries_the_knobs_in_the_header_and_the_prompt() -> None:
    shape = parse_knobs("frames=3;pause_after=1;pause=2s;id=fp-1")
    data = request_for(shape, host="api.example.com", path="/llm/v1/chat/completions")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /llm/v1/chat/completions HTTP/1.1"
    header = next(line for line in lines if line.startswith("X-Middlebox-Probe: "))
    parsed = json.loads(body)
    assert f"Content-Length: {len(body)}" in lines and parsed["stream"] is True
    source, knobs = knobs_in_request(header.partition(": ")[2], parsed)
    assert (source, parse_knobs(knobs)) == ("header", shape)
    source, knobs = knobs_in_request(None, parsed)  # a gateway dropped the header
    assert (source, parse_knobs(knobs)) == ("prompt", shape)
    assert request_for(shape, host="h", http10=True).startswith(
        b"POST /v1/chat/completions HTTP/1.0"
    )


def test_a_pause_after_the_last_frame_delays_the_end() -> None:
    # a stream that goes quiet and is then cut: what an idle timeout after the head sees
    played = plan(parse_knobs("frames=2;period=50ms;pause_after=2;pause=3s;end=rst"),
                  http10=False, ident="x", model="m")  # fmt: skip
    assert played.writes[-1].at == pytest.approx(0.1)
    assert played.end_at == pytest.approx(3.1) and played.end == "rst"
    done = plan(parse_knobs("frames=2;period=50ms;pause_after=2;pause=3s"), http10=False,
                ident="x", model="m")  # fmt: skip
    assert [(w.kind, w.at) for w in done.writes[-2:]] == [
        ("done", pytest.approx(3.1)), ("last-chunk", pytest.approx(3.1))]  # fmt: skip
