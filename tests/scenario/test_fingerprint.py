"""The fingerprinter's measures on the virtual clock: a probe shape's plan (what the probe
upstream writes, `probe_shape.timeline`) replayed through a path of faults
(`faults.testing.replay`), the client's side decoded, and the measures read back. A known
fault's parameters must come out within the stated tolerance, and a path without the
fault must not show it."""

from __future__ import annotations

from typing import Any

from faults.coalescer import Coalescer
from faults.proxy_buffering import ProxyBuffering
from faults.testing import replay
from middlebox.core.fault import Fault
from middlebox.core.stream import DOWN, Chunk
from middlebox.scenario import fingerprint as fp
from middlebox.scenario import probe_shape
from middlebox.scenario.fingerprint import ACCEL, HOLD_A, HOLD_B
from middlebox.scenario.probe_shape import ProbeShape


def through(shape: ProbeShape, fault: Fault | None) -> dict[str, Any]:
    """`hold` of `shape` through `fault` (None: a bare path), on the virtual clock; the
    probe's write times are the plan's, as a record on an idle machine says."""
    plan = probe_shape.plan(shape, http10=False, ident="t", model="middlebox-probe")
    timeline = probe_shape.timeline(plan, probe_shape.request_for(shape, host="probe"))
    out = replay(fault, timeline) if fault is not None else timeline
    reads = [fp.Read(at, item.data) for at, item in out
             if isinstance(item, Chunk) and item.direction is DOWN]  # fmt: skip
    frames = [write.at for write in plan.writes if write.kind == "frame"]
    return fp.hold(plan, frames, fp.decode(reads), period=shape.period)


def released(fault: type[Fault] | None, **params: Any) -> dict[str, Any]:
    first = through(HOLD_A, fault(**params) if fault else None)
    second = through(HOLD_B, fault(**params) if fault else None)
    return fp.release(first, second)


def test_a_bare_path_holds_nothing() -> None:
    assert released(None) == {"held": False, "by": "nothing"}
    assert through(HOLD_A, None)["max_wait"] == 0.0


def test_nginx_buffering_is_found_as_a_4_kib_buffer_within_a_frame() -> None:
    found = released(ProxyBuffering)
    assert found["by"] == "size"
    assert abs(found["bytes"] - 4096) <= found["uncertainty"] <= 263


def test_a_larger_buffer_is_found_at_its_size() -> None:
    found = released(ProxyBuffering, buffer_size=8192, buffers_size=8192)
    assert found["by"] == "size" and abs(found["bytes"] - 8192) <= found["uncertainty"]


def test_a_1_kib_buffer_shows_postpone_output_doubling_it_as_nginx_does() -> None:
    # nginx's write filter holds output under postpone_output (1460) until the next buffer
    found = released(ProxyBuffering, buffer_size=1024, buffers_size=1024)
    assert found["by"] == "size" and abs(found["bytes"] - 2048) <= found["uncertainty"]


def test_a_buffer_larger_than_both_answers_is_a_hold_to_the_end() -> None:
    found = released(ProxyBuffering, buffer_size=65536, buffers_size=65536)
    assert found["by"] == "end" and found["at_least_bytes"] > 24 * 1024


def test_a_coalescing_window_is_found_as_a_timer() -> None:
    found = released(Coalescer, window=0.3, size=1_000_000)
    assert found["by"] == "timer"
    assert abs(found["seconds"] - 0.3) <= max(found["uncertainty"], 0.01)


def test_x_accel_buffering_no_is_honoured_by_nginx_buffering() -> None:
    plain = through(HOLD_A, ProxyBuffering())
    assert fp.accel_honoured(plain, through(ACCEL, ProxyBuffering())) is True


def test_x_accel_buffering_no_is_not_honoured_when_the_config_ignores_it() -> None:
    fault = ProxyBuffering(honour_x_accel_buffering=False)
    plain = through(HOLD_A, ProxyBuffering(honour_x_accel_buffering=False))
    assert fp.accel_honoured(plain, through(ACCEL, fault)) is False


def test_x_accel_buffering_has_no_verdict_on_a_path_that_holds_nothing() -> None:
    assert fp.accel_honoured(through(HOLD_A, None), through(ACCEL, None)) is None


def test_a_stream_that_did_not_arrive_whole_is_not_read_as_a_hold() -> None:
    plan = probe_shape.plan(HOLD_A, http10=False, ident="t", model="m")
    timeline = probe_shape.timeline(plan, b"")
    cut = b"".join(item.data for _, item in timeline[1:5] if isinstance(item, Chunk))
    frames = [write.at for write in plan.writes if write.kind == "frame"]
    half = fp.hold(plan, frames, fp.decode([fp.Read(0.1, cut)]), period=HOLD_A.period)
    assert half["release"] == "incomplete" and not half["complete"]
    assert fp.release(half, half)["held"] is None


def test_header_changes_name_what_was_added_removed_and_changed() -> None:
    sent = [["Host", "front:80"], ["X-Secret", "s"], ["Accept", "text/event-stream"]]
    arrived = [["host", "10.0.0.5:8000"], ["Accept", "text/event-stream"], ["X-Team", "a"]]
    assert fp.header_changes(sent, arrived) == {
        "added": [["X-Team", "a"]],
        "removed": [["X-Secret", "s"]],
        "changed": [["host", "front:80", "10.0.0.5:8000"]],
    }


def test_headers_that_arrive_as_sent_are_no_change_whatever_their_case() -> None:
    sent = [["Host", "h"], ["Accept", "a"]]
    assert fp.header_changes(sent, [["host", "h"], ["ACCEPT", "a"]]) == {
        "added": [], "removed": [], "changed": [],
    }  # fmt: skip


# Varnish 7.1's answers to two requests a few seconds apart (its transaction id, the Date)
PLANNED = [["Content-Type", "text/event-stream"]]
VARNISH_FIRST = [
    ["Content-Type", "text/event-stream"],
    ["X-Varnish", "32770"],
    ["Age", "0"],
    ["Via", "1.1 varnish (Varnish/7.1)"],
    ["Date", "Fri, 04 Dec 2026 23:56:03 GMT"],
]
VARNISH_AGAIN = [
    ["Content-Type", "text/event-stream"],
    ["x-varnish", "32773"],
    ["Age", "0"],
    ["Via", "1.1 varnish (Varnish/7.1)"],
    ["Date", "Fri, 04 Dec 2026 23:56:06 GMT"],
]


def test_fields_that_change_on_a_second_request_are_varying_and_fixed_ones_are_not() -> None:
    first = fp.header_changes(PLANNED, VARNISH_FIRST)
    again = fp.header_changes(PLANNED, VARNISH_AGAIN)
    assert fp.varying(first, again) == [
        ["X-Varnish", "32770", "32773"],
        ["Date", "Fri, 04 Dec 2026 23:56:03 GMT", "Fri, 04 Dec 2026 23:56:06 GMT"],
    ]
    assert fp.varying(first, first) == []


def test_a_field_a_hop_wrote_once_and_not_again_is_varying_with_no_second_value() -> None:
    first = {"added": [["X-Cache", "MISS"]], "removed": [], "changed": [["Host", "a", "b"]]}
    again = {"added": [], "removed": [], "changed": [["host", "a", "b"]]}
    assert fp.varying(first, again) == [["X-Cache", "MISS", ""]]


def test_the_summary_names_the_values_that_changed_per_request_only_when_some_did() -> None:
    changes = fp.header_changes(PLANNED, VARNISH_FIRST)
    changes["varying"] = [["X-Varnish", "32770", "32773"]]
    lines = fp.summary({"url": "u", "measures": {"response_headers": changes}, "not_measured": []})
    assert "Response headers that changed on a second request: X-Varnish: 32770 then 32773." in (
        lines
    )
    changes["varying"] = []
    lines = fp.summary({"url": "u", "measures": {"response_headers": changes}, "not_measured": []})
    assert not any("second request" in line for line in lines)


def record_of(version: str, framing: str, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "request": {"version": version, "headers": []},
        "framing": framing,
        "writes": {"frames": [0.02 * (k + 1) for k in range(10)]},
        "frames_written": 10,
        "client_left": None,
        "frames_after_leave": 0,
    }
    record.update(fields)
    return record


def test_a_close_delimited_upstream_chunked_toward_the_client_is_rechunked() -> None:
    shape = ProbeShape(frames=3, size=256, period=0.01)
    plan = probe_shape.plan(shape, http10=True, ident="t", model="m", keep_alive=False)
    body = b"".join(write.data for write in plan.writes[1:])
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:300], body[300:]))
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    response = fp.decode([fp.Read(0.05, head + chunked + b"0\r\n\r\n")])
    found = fp.framing(record_of("HTTP/1.0", "close"), plan, response)
    assert found["upstream_version"] == "HTTP/1.0" and found["upstream_framing"] == "close"
    assert (found["client_framing"], found["client_chunks"], found["rechunked"]) == (
        "chunked", 2, True,
    )  # fmt: skip


def test_chunks_passed_as_the_probe_wrote_them_are_not_rechunked() -> None:
    shape = ProbeShape(frames=3, size=256, period=0.01)
    plan = probe_shape.plan(shape, http10=False, ident="t", model="m")
    response = fp.decode([fp.Read(w.at, w.data) for w in plan.writes], ended=False)
    found = fp.framing(record_of("HTTP/1.1", "chunked"), plan, response)
    assert response.complete and found["rechunked"] is False


def test_a_leave_the_upstream_learns_later_counts_the_frames_written_after() -> None:
    record = record_of("HTTP/1.1", "chunked",
                       client_left={"how": "fin", "at": 0.16, "frames_written": 8})  # fmt: skip
    found = fp.leave(record, closed_at=0.05, waited=5.0)
    assert found == {"learned": True, "how": "fin", "after": 0.11, "frames_after_close": 6}


def test_a_leave_the_upstream_never_learns_is_reported_as_at_least_the_wait() -> None:
    found = fp.leave(record_of("HTTP/1.1", "chunked"), closed_at=0.05, waited=5.0)
    assert found == {"learned": False, "at_least": 5.0, "frames_after_close": 8}


def document(hold: dict[str, Any], **measures: Any) -> dict[str, Any]:
    return {"url": "http://front/v1", "measures": {"hold": hold, **measures}}


def test_the_summary_says_the_buffer_and_that_x_accel_is_honoured() -> None:
    shapes = [through(HOLD_A, ProxyBuffering()), through(HOLD_B, ProxyBuffering())]
    hold = {"release": fp.release(*shapes), "shapes": shapes, "x_accel_buffering_honoured": True}
    lines = fp.summary(document(hold))
    assert lines[1].startswith("It holds ~4.0 KiB (± 26") and "0.30 s late" in lines[1]
    assert lines[2] == "It honours X-Accel-Buffering: no."


def test_the_summary_of_a_bare_path_claims_no_hold_and_no_header_change() -> None:
    shapes = [through(HOLD_A, None), through(HOLD_B, None)]
    none: dict[str, list[list[str]]] = {"added": [], "removed": [], "changed": []}
    lines = fp.summary(
        document({"release": fp.release(*shapes), "shapes": shapes}, request_headers=none)
    )
    assert lines[1] == "It holds nothing: every frame reaches the client as it is written."
    assert "Request headers: unchanged." in lines
    assert not any("X-Accel" in line for line in lines)


def test_a_client_descheduled_for_a_moment_is_not_a_hold() -> None:
    # a 60 ms stall of the reading process delays three frames, then it reads on
    plan = probe_shape.plan(HOLD_A, http10=False, ident="t", model="m")
    reads = [fp.Read(w.at + (0.06 - (w.at - 0.4) if 0.4 <= w.at < 0.46 else 0.0), w.data)
             for w in plan.writes]  # fmt: skip
    frames = [write.at for write in plan.writes if write.kind == "frame"]
    found = fp.hold(plan, frames, fp.decode(reads, ended=False), period=HOLD_A.period)
    assert found["max_wait"] >= 0.04 and found["release"] == "none"


def test_a_two_frame_buffer_is_a_hold() -> None:
    found = released(ProxyBuffering, buffer_size=512, buffers_size=512, postpone_output=1)
    assert found["held"] is True and found["by"] == "size"
    assert abs(found["bytes"] - 512) <= found["uncertainty"]


def silent_record(left: dict[str, Any] | None) -> dict[str, Any]:
    return record_of("HTTP/1.1", "chunked", client_left=left,
                     writes={"frames": [0.02] if left else [0.02, 30.04]})  # fmt: skip


def test_a_hop_that_closes_the_upstream_during_the_silence_gives_its_read_timeout() -> None:
    left = {"how": "fin", "at": 1.02, "frames_written": 1}
    cut = fp.decode([fp.Read(1.0, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")])
    assert fp.idle(silent_record(left), cut, pause=30.0) == {
        "cut": True, "timeout": 1.0, "cut_at": 1.02, "how": "fin", "client_saw": "truncated",
    }  # fmt: skip


def test_a_silence_the_path_lets_pass_is_at_least_its_length() -> None:
    whole = b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\ndata: [DONE]\n\n"
    found = fp.idle(silent_record(None), fp.decode([fp.Read(30.1, whole)]), pause=30.0)
    assert found == {"cut": False, "at_least": 30.0, "client_saw": "complete"}


def test_a_proper_end_without_done_is_told_apart_from_a_whole_answer() -> None:
    left = {"how": "fin", "at": 1.02, "frames_written": 1}
    ended = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n0\r\n\r\n"
    found = fp.idle(silent_record(left), fp.decode([fp.Read(1.0, ended)]), pause=30.0)
    assert found["client_saw"] == "complete-without-done"


def test_the_summary_says_the_read_timeout_or_that_it_is_at_least_the_silence() -> None:
    cut = {"cut": True, "timeout": 1.0, "how": "fin", "client_saw": "truncated"}
    lines = fp.summary({"url": "u", "measures": {"idle": cut}})
    assert lines[1] == (
        "It cuts a stream silent for 1.00 s (its read timeout after the head; the upstream "
        "saw a fin, the client a truncated response)."
    )
    passed = fp.summary({"url": "u", "measures": {"idle": {"cut": False, "at_least": 30.0}}})
    assert (
        passed[1]
        == "Its read timeout after the head is at least 30.0 s (a silence that long passed)."
    )
