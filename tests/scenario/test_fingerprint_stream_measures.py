"""The fingerprinter's stream measures on the virtual clock: compression and its flush, the
SSE fields (heartbeats, `retry:`, `id:`, `Last-Event-ID`), a client's reset, the timeout
before the response head and a duration cap. A probe
shape's plan (`probe_shape.timeline`) is replayed through a path of faults
(`faults.testing.replay`), the client's side decoded and measured; each verdict has a path
where it must appear and one where it must not, and the fitter gives the fault back (or
says plainly that none expresses it)."""

from __future__ import annotations

import gzip
from typing import Any

from faults.gzip_encoding import GzipEncoding
from faults.idle_reaper import IdleReaper
from faults.ignore_client_close import IgnoreClientClose
from faults.max_duration import MaxDuration
from faults.presets import PRESETS
from faults.proxy_buffering import ProxyBuffering
from faults.sse_ids import SseIds
from faults.sse_retry import SseRetry
from faults.strip_header import StripHeader
from faults.testing import replay
from middlebox import compose
from middlebox.core.fault import Fault, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset
from middlebox.scenario import fingerprint as fp
from middlebox.scenario import fit, probe_shape
from middlebox.scenario.fingerprint import ACCEPT_GZIP, COMPRESS, LAST_EVENT_ID, SSE_FIELDS
from middlebox.scenario.probe_shape import ProbeShape
from middlebox.tools.fingerprint import LEAVE


def played(
    shape: ProbeShape,
    path: list[Fault],
    headers: tuple[tuple[str, str], ...] = (),
    extra: tuple[tuple[float, Item], ...] = (),
) -> tuple[probe_shape.Plan, list[tuple[float, Item]]]:
    """The plan of `shape` and the replay of its exchange through `path` (the request
    with `headers`; `extra`: the client's own items, a reset)."""
    plan = probe_shape.plan(shape, http10=False, ident="t", model="middlebox-probe")
    request = probe_shape.request_for(shape, host="probe", extra_headers=headers)
    timeline = sorted([*probe_shape.timeline(plan, request), *extra], key=lambda x: x[0])
    return plan, replay(Pipeline(path), timeline)


def client_side(out: list[tuple[float, Item]]) -> fp.Response:
    reads = [fp.Read(at, item.data) for at, item in out
             if isinstance(item, Chunk) and item.direction is DOWN]  # fmt: skip
    return fp.decode(reads, ended=False)


def arrived_headers(out: list[tuple[float, Item]]) -> list[list[str]]:
    """The request head as it reached the upstream (what the probe's record keeps)."""
    sent = b"".join(i.data for _, i in out if isinstance(i, Chunk) and i.direction is UP)
    lines = sent.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return [[n.strip(), v.strip()] for n, _, v in (line.partition(":") for line in lines)]


def first_end(out: list[tuple[float, Item]], direction: Any) -> tuple[float, Item] | None:
    """The first end (a FIN or an RST) going `direction` in the replay's output."""
    ends = [(at, item) for at, item in out if isinstance(item, Eof | Reset)]
    return next(((at, item) for at, item in ends if item.direction is direction), None)


# -- compression --------------------------------------------------------------------------------


def compression_of(make: Any) -> dict[str, Any]:
    """The compression measure of the path `make()` builds: the check's answer without
    Accept-Encoding, the compression shape's with it, its hold on the decoded body."""
    _, plain = played(COMPRESS, make())
    plan, out = played(COMPRESS, make(), ACCEPT_GZIP)
    asked = client_side(out)
    body = fp.decoded(asked)
    frames = [write.at for write in plan.writes if write.kind == "frame"]
    held = None if body is None else fp.hold(plan, frames, body, period=COMPRESS.period)
    return fp.compression(client_side(plain), asked, held)


def test_gzip_flushed_per_read_is_found_decodable_per_frame() -> None:
    found = compression_of(lambda: [GzipEncoding(flush="sync")])
    assert (found["compresses"], found["asked"], found["unasked"]) == (True, "gzip", None)
    assert found["flush"] == "per-frame" and found["max_wait"] <= 0.001
    fitted = fit.fit({"compression": found})
    assert fitted.path == [{"gzip_encoding": {"flush": "sync"}}] and fitted.not_fitted == []


def test_gzip_under_buffering_is_found_held_and_fitted_so() -> None:
    found = compression_of(lambda: [GzipEncoding(flush="none")])
    assert found["flush"] == "held" and found["release"] == "end"
    assert found["first_frame_wait"] >= 0.9  # the whole ~1 s stream waits for zlib
    assert fit.fit({"compression": found}).path == [{"gzip_encoding": {"flush": "none"}}]


def test_a_hop_that_compresses_unasked_is_said_so() -> None:
    found = compression_of(lambda: [GzipEncoding(flush="sync", require_accept_encoding=False)])
    assert found["unasked"] == "gzip"
    config = fit.fit({"compression": found}).config("gzip_encoding")
    assert config == {"flush": "sync", "require_accept_encoding": False}


def test_a_bare_path_does_not_compress_and_fits_nothing() -> None:
    found = compression_of(list)
    assert found == {"asked": None, "unasked": None, "compresses": False}
    assert fit.fit({"compression": found}).path == []
    assert fp.summary({"url": "u", "measures": {"compression": found}})[1] == (
        "It does not compress the event stream (asked with Accept-Encoding: gzip)."
    )


def test_a_coding_no_fault_writes_is_said_not_fitted() -> None:
    found = {"asked": "br", "unasked": None, "compresses": True}
    fitted = fit.fit({"compression": found})
    assert fitted.path == []
    assert fitted.not_fitted[0].startswith("compression: the path encodes the stream as br")


def test_a_gzip_body_is_decoded_read_by_read_and_a_brotli_one_is_not() -> None:
    body = gzip.compress(b"data: hello\n\n")
    head = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(body)
    response = fp.decode([fp.Read(0.1, head + body[:5]), fp.Read(0.2, body[5:])])
    decoded = fp.decoded(response)
    assert decoded is not None and bytes(decoded.body) == b"data: hello\n\n"
    assert decoded.body_at[-1] == (0.2, 13)
    brotli = fp.decode([fp.Read(0.1, head.replace(b"gzip", b"br") + body)])
    assert fp.decoded(brotli) is None


def preset_path(name: str) -> list[Fault]:
    return compose.load_text(f"name: p\npath:\n  - preset: {name}\n").build_faults()


def test_compression_tells_nginx_gzip_from_nginx_default() -> None:
    rows = {
        name: fit.agreement(
            {"compression": fit.compression_value(compression_of(lambda n=name: preset_path(n)))},
            fit.expected(PRESETS[name]),
        )
        for name in ("nginx-default", "nginx-gzip")
    }
    assert rows["nginx-gzip"][0].path == "gzip, held" and rows["nginx-gzip"][0].ok
    assert rows["nginx-default"][0].path == "none" and rows["nginx-default"][0].ok
    gzip_seen = {"compression": "gzip, held"}
    assert not fit.agreement(gzip_seen, fit.expected(PRESETS["nginx-default"]))[0].ok


# -- the SSE fields ---------------------------------------------------------------------------


BEAT = b"%x\r\n%s\r\n" % (len(probe_shape.HEARTBEAT), probe_shape.HEARTBEAT)


def sse_of(path: list[Fault], eat_comments: bool = False) -> dict[str, Any]:
    """The SSE-fields measure of `path`; `eat_comments`: a hop that drops comment lines
    (no fault does: the client's reads are edited here, as such a hop would send them)."""
    plan, out = played(SSE_FIELDS, path, (("Last-Event-ID", LAST_EVENT_ID),))
    response = client_side(out)
    if eat_comments:
        down = [
            (at, item) for at, item in out if isinstance(item, Chunk) and item.direction is DOWN
        ]
        reads = [fp.Read(at, item.data.replace(BEAT, b"")) for at, item in down]
        response = fp.decode(reads, ended=False)
    record = {"request": {"headers": arrived_headers(out)}}
    return fp.sse_fields(plan, record, response, LAST_EVENT_ID)


def test_a_bare_path_passes_every_sse_field() -> None:
    found = sse_of([])
    assert found["heartbeats"] == {"sent": 3, "arrived": 3, "verdict": "passed"}
    assert found["retry"] == {"sent": ["2500"], "arrived": ["2500"], "verdict": "passed"}
    assert found["id"]["arrived"] == ["1", "2", "3", "4"] and found["id"]["verdict"] == "passed"
    assert found["last_event_id"] == {"sent": "probe-7", "arrived": "probe-7", "verdict": "passed"}
    fitted = fit.fit({"sse_fields": found})
    assert fitted.path == [] and fitted.not_fitted == []
    assert fp.summary({"url": "u", "measures": {"sse_fields": found}})[1] == (
        "SSE fields: heartbeats passed (3 of 3); retry: lines passed; id: lines passed; "
        "Last-Event-ID passed."
    )


def test_stripped_retry_lines_are_removed_and_fitted_as_sse_retry_strip() -> None:
    found = sse_of([SseRetry(mode="strip")])
    assert found["retry"]["verdict"] == "removed" and found["id"]["verdict"] == "passed"
    assert fit.fit({"sse_fields": found}).path == [{"sse_retry": {"mode": "strip"}}]


def test_a_rewritten_retry_is_changed_and_its_value_fitted() -> None:
    found = sse_of([SseRetry(mode="change", delay=10.0)])
    assert found["retry"] == {"sent": ["2500"], "arrived": ["10000"], "verdict": "changed"}
    fitted = fit.fit({"sse_fields": found})
    assert fitted.path == [{"sse_retry": {"mode": "change", "delay": 10.0}}]
    compose.load_text(fit.scenario_text(fitted, name="retry", url="u"))


def test_stripped_and_renumbered_ids_are_fitted_as_sse_ids() -> None:
    stripped = sse_of([SseIds(mode="strip")])
    assert stripped["id"]["verdict"] == "removed" and stripped["retry"]["verdict"] == "passed"
    assert fit.fit({"sse_fields": stripped}).path == [{"sse_ids": {"mode": "strip"}}]
    renumbered = sse_of([SseIds(mode="renumber", start=10)])
    assert renumbered["id"]["verdict"] == "changed"
    fitted = fit.fit({"sse_fields": renumbered})
    start = fitted.path[0]["sse_ids"]["start"]
    # played back, the fitted fault gives the same ids
    again = sse_of([SseIds(mode="renumber", start=start)])
    assert again["id"]["arrived"] == renumbered["id"]["arrived"]


def test_a_last_event_id_the_hop_drops_is_removed_and_fitted_as_a_request_strip() -> None:
    found = sse_of([StripHeader(headers=["Last-Event-ID"], direction="request")])
    assert found["last_event_id"] == {"sent": "probe-7", "arrived": None, "verdict": "removed"}
    fitted = fit.fit({"sse_fields": found})
    assert fitted.path == [{"strip_header": {"headers": ["Last-Event-ID"], "direction": "request"}}]
    compose.load_text(fit.scenario_text(fitted, name="lei", url="u"))


def test_eaten_heartbeats_are_said_as_no_fault_and_never_dropped() -> None:
    found = sse_of([], eat_comments=True)
    assert found["heartbeats"] == {"sent": 3, "arrived": 0, "verdict": "eaten"}
    assert found["retry"]["verdict"] == "passed"
    fitted = fit.fit({"sse_fields": found})
    assert fitted.path == []
    assert fitted.not_fitted == [
        "sse_fields: 0 of 3 `: keep-alive` comments arrived; no fault drops SSE comments"
    ]
    assert "# Not expressed by any fault:" in fit.scenario_text(fitted, name="x", url="u")


# -- a client's reset -------------------------------------------------------------------------

CLOSE_AT = 0.11  # the client resets after five frames of the 20 ms leave shape


def reset_of(path: list[Fault], how: type[Eof] | type[Reset] = Reset) -> dict[str, Any]:
    """The leave measure of a client that ends with `how` (a Reset, or an Eof: a FIN)
    through `path`: the upstream learns when the path's end of it reaches the probe."""
    plan, out = played(LEAVE, path, extra=((CLOSE_AT, how(UP)),))
    end = first_end(out, UP)
    learned = None if end is None else end[0]
    frames = [write.at for write in plan.writes if write.kind == "frame"]
    record: dict[str, Any] = {"writes": {"frames": frames}, "client_left": None,
                              "frames_written": len(frames)}  # fmt: skip
    if learned is not None:
        written = [at for at in frames if at <= learned]
        record["client_left"] = {"how": "rst" if how is Reset else "fin", "at": learned,
                                 "frames_written": len(written)}  # fmt: skip
        record["writes"]["frames"] = written
    return fp.leave(record, closed_at=CLOSE_AT, waited=5.0)


def test_a_bare_path_passes_a_reset_at_once() -> None:
    found = reset_of([])
    assert found == {"learned": True, "how": "rst", "after": 0.0, "frames_after_close": 0}
    assert fit.fit({"leave_rst": found, "leave": reset_of([], Eof)}).not_fitted == []


def test_a_hop_that_drains_the_upstream_never_passes_the_reset() -> None:
    found = reset_of([IgnoreClientClose(until="never")])
    assert found["learned"] is False and found["frames_after_close"] > 200
    fitted = fit.fit({"leave_rst": found})  # no FIN measured: fitted from the reset
    assert fitted.path == [{"ignore_client_close": {"until": "never"}}]
    line = fp.summary({"url": "u", "measures": {"leave_rst": found}})[1]
    assert line == (
        "A client that resets its connection is not noticed by the upstream within 5.0 s: "
        "it generates for nobody."
    )


def test_a_hop_that_learns_at_its_next_write_passes_a_reset_a_frame_later() -> None:
    # ignore_client_close: after a client's RST the next write fails at once
    found = reset_of([IgnoreClientClose(until="write_fails")])
    assert found["learned"] is True and found["after"] <= 0.02 + 1e-9
    assert found["frames_after_close"] <= 1
    fin = reset_of([IgnoreClientClose(until="write_fails")], Eof)
    fitted = fit.fit({"leave": fin, "leave_rst": found})
    # the FIN's second write fails: the fault fitted for it passes the reset as measured
    assert fitted.config("ignore_client_close") == {"until": "write_fails"}
    assert fitted.not_fitted == []


def test_a_reset_held_while_a_fin_passes_is_said_as_no_fault() -> None:
    fin = {"learned": True, "how": "fin", "after": 0.001, "frames_after_close": 0}
    rst = {"learned": False, "at_least": 5.0, "frames_after_close": 240}
    fitted = fit.fit({"leave": fin, "leave_rst": rst})
    assert fitted.path == []
    assert fitted.not_fitted == [
        "leave_rst: a client's FIN reaches the upstream at once but its reset not within "
        "5.0 s; no fault passes a FIN and holds a reset"
    ]
    rows = fit.agreement(fit.values({"leave_rst": rst}), fit.expected(PRESETS["passthrough"]))
    assert [(row.measure, row.ok) for row in rows] == [("rst_learned", False)]


def test_compression_and_sse_rows_agree_with_a_preset_that_passes_them() -> None:
    measures = {"compression": compression_of(list), "sse_fields": sse_of([])}
    rows = fit.agreement(fit.values(measures), fit.expected(PRESETS["passthrough"]))
    assert {row.measure for row in rows} == {
        "compression", "compresses_unasked", "heartbeats", "retry_lines", "id_lines",
    }  # fmt: skip
    assert all(row.ok for row in rows)


def test_gzip_flushed_per_read_behind_a_buffer_is_held() -> None:
    found = compression_of(lambda: [ProxyBuffering(), GzipEncoding(flush="sync")])
    assert found["flush"] == "held" and found["release"] == "periodic"


# -- the timeout before the head, and a duration cap ---------------------------------------------


def cut_of(shape: ProbeShape, path: list[Fault]) -> tuple[dict[str, Any], fp.Response, str, Any]:
    """The record, the client's response, how the path ended the client's connection
    (`fin`, `rst`, `open`) and when, for `shape` played through `path`: the probe learns
    of the path's close (or reset) of the upstream connection when it reaches it."""
    plan, out = played(shape, path)
    frames = [write.at for write in plan.writes if write.kind == "frame"]
    up_end, down_end = first_end(out, UP), first_end(out, DOWN)
    written = [at for at in frames if up_end is None or at <= up_end[0]]
    record: dict[str, Any] = {"writes": {"frames": written}, "client_left": None,
                              "frames_written": len(written)}  # fmt: skip
    if up_end is not None:
        how = "rst" if isinstance(up_end[1], Reset) else "fin"
        record["client_left"] = {"how": how, "at": up_end[0], "frames_written": len(written)}
    ended = "open" if down_end is None else "rst" if isinstance(down_end[1], Reset) else "fin"
    return record, client_side(out), ended, None if down_end is None else down_end[0]


def head_of(path: list[Fault], pause: float = 30.0) -> dict[str, Any]:
    shape = fp.head_idle_shape(pause)
    record, response, ended, ended_at = cut_of(shape, path)
    return fp.head_idle(record, response, ended, ended_at, shape.head_delay)


def cap_of(path: list[Fault], length: float = 20.0) -> dict[str, Any]:
    shape = fp.cap_shape(length)
    record, response, ended, ended_at = cut_of(shape, path)
    return fp.duration_cap(record, response, ended, ended_at, shape.duration)


def test_a_read_timeout_before_the_head_gives_its_time_and_its_status_page() -> None:
    found = head_of([IdleReaper(timeout=2.5, before_headers="502")])
    assert (found["cut"], found["timeout"], found["end"]) == (True, 2.5, "status 502")
    assert found["uncertainty"] == 0.0
    fitted = fit.fit({"head_idle": found})
    assert fitted.path == [{"idle_reaper": {"timeout": 2.5, "before_headers": "502"}}]
    compose.load_text(fit.scenario_text(fitted, name="head", url="u"))


def test_a_reset_before_the_head_is_told_from_a_page() -> None:
    found = head_of([IdleReaper(timeout=1.0, before_headers="reset")])
    assert (found["timeout"], found["end"]) == (1.0, "reset")


def test_a_bare_path_waits_for_a_late_head_and_says_at_least() -> None:
    found = head_of([])
    assert found == {"cut": False, "at_least": 30.0, "client_saw": "complete"}
    assert fp.summary({"url": "u", "measures": {"head_idle": found}})[1] == (
        "Its timeout before the head is at least 30.0 s (a head that late passed)."
    )
    assert fit.fit({"head_idle": found}).path == []


def test_one_read_timeout_before_and_after_the_head_is_one_idle_reaper() -> None:
    path = lambda: [IdleReaper(timeout=3.0, before_headers="502")]  # noqa: E731
    measures = {"head_idle": head_of(path()), "idle": idle_after(path())}
    fitted = fit.fit(measures)
    assert fitted.path == [
        {"idle_reaper": {"timeout": 3.0, "after_headers": "close", "before_headers": "502"}}
    ]
    assert fitted.not_fitted == []


def test_timeouts_that_differ_before_and_after_the_head_are_said() -> None:
    measures = {"head_idle": head_of([IdleReaper(timeout=5.0)]),
                "idle": idle_after([IdleReaper(timeout=1.0)])}  # fmt: skip
    assert fit.fit(measures).not_fitted == [
        "head_idle: the timeout before the head is 5.00 s, after it 1.00 s; idle_reaper has "
        "one timeout for both (fitted: after)"
    ]


def idle_after(path: list[Fault], silence: float = 30.0) -> dict[str, Any]:
    shape = fp.idle_shape(silence)
    record, response, _, _ = cut_of(shape, path)
    return fp.idle(record, response, shape.pause)


def test_a_duration_cap_cuts_a_busy_stream_at_its_limit() -> None:
    found = cap_of([MaxDuration(limit=4.0)])
    assert found["cut"] is True and abs(found["limit"] - 4.0) <= found["uncertainty"]
    assert found["client_saw"] == "truncated" and 38 <= found["frames_before"] <= 40
    # a read timeout longer than the frame period never fires on the busy stream
    assert cap_of([IdleReaper(timeout=1.0)])["cut"] is False


def test_a_bare_path_has_no_cap_within_the_stream() -> None:
    found = cap_of([])
    assert found == {"cut": False, "at_least": 20.0, "client_saw": "complete"}
    assert fit.fit({"duration_cap": found}).path == []


def test_a_cap_is_fitted_as_max_duration_and_explains_the_silences_it_cut() -> None:
    path = lambda: [MaxDuration(limit=4.0, end="rst", before_headers="502")]  # noqa: E731
    measures = {"duration_cap": cap_of(path()), "head_idle": head_of(path()),
                "idle": idle_after(path())}  # fmt: skip
    assert measures["duration_cap"]["client_saw"] == "reset"
    assert measures["head_idle"]["end"] == "status 502"
    assert measures["idle"]["cut"] is True  # the cap, not a read timeout, cut the silence
    fitted = fit.fit(measures)
    assert fitted.path == [
        {"max_duration": {"limit": measures["duration_cap"]["limit"], "end": "rst",
                          "before_headers": "502"}}
    ]  # fmt: skip
    assert fitted.not_fitted == []
    compose.load_text(fit.scenario_text(fitted, name="cap", url="u"))
    line = fp.summary({"url": "u", "measures": {"duration_cap": measures["duration_cap"]}})[1]
    assert line.startswith("It cuts a busy stream 4.0") and "a duration cap" in line


def test_the_cap_and_the_head_timeout_rows_agree_with_presets_that_have_none() -> None:
    measures = {"duration_cap": cap_of([]), "head_idle": head_of([])}
    rows = fit.agreement(fit.values(measures), fit.expected(PRESETS["passthrough"]))
    assert [(row.measure, row.ok) for row in rows] == [
        ("head_timeout", True), ("duration_cap", True),
    ]  # fmt: skip
    capped = {"duration_cap": cap_of([MaxDuration(limit=4.0)])}
    assert not fit.agreement(fit.values(capped), fit.expected(PRESETS["passthrough"]))[0].ok


def test_a_cut_after_the_probe_stalled_is_not_read_as_a_cap() -> None:
    # the probe's writes (a loaded machine) stopped at 2.0 s; a read timeout cut at 2.8 s
    writes = [round(0.1 * (k + 1), 3) for k in range(20)]
    record = {"writes": {"frames": writes}, "frames_written": 20,
              "client_left": {"how": "fin", "at": 2.8, "frames_written": 20}}  # fmt: skip
    cut = fp.decode([fp.Read(0.1, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")])
    found = fp.duration_cap(record, cut, "fin", 2.8, 20.0)
    assert found == {"cut": False, "at_least": 2.8, "client_saw": "truncated",
                     "quiet_before_cut": 0.8}  # fmt: skip
    record["client_left"]["at"] = 2.05  # cut while the stream was busy: a cap
    assert fp.duration_cap(record, cut, "fin", 2.05, 20.0)["cut"] is True
