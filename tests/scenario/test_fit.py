"""The fitter on the virtual clock: a path assembled from faults with random parameters is
fingerprinted (the probe's shapes, `probe_shape.timeline`, replayed through the path by
`faults.testing.replay`, the client's side decoded and measured by the fingerprint's own
measures) and the fitted scenario must give back its parameters within the stated
tolerance, and load as a scenario. The closest preset and the lines for what no fault
expresses have cases where they must appear and where they must not."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.compare import TOLERANCES as CALIBRATE
from faults import REGISTRY
from faults.buffer_whole_response import BufferWholeResponse
from faults.coalescer import Coalescer
from faults.idle_reaper import IdleReaper
from faults.presets import PRESETS
from faults.proxy_buffering import ProxyBuffering
from faults.testing import replay
from middlebox import compose
from middlebox.core.fault import Fault, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from middlebox.scenario import fingerprint as fp
from middlebox.scenario import fit, probe_shape
from middlebox.scenario.fingerprint import ACCEL, HOLD_A, HOLD_B
from middlebox.scenario.probe_shape import ProbeShape

SILENCE = 60.0  # the idle shape's pause: longer than every timeout drawn below
# the request the probe answers (its knobs are the shape's, which the plan already has)
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Length: 0\r\n\r\n"


def hold_of(shape: ProbeShape, path: list[Fault]) -> dict[str, Any]:
    plan = probe_shape.plan(shape, http10=False, ident="t", model="middlebox-probe")
    out = replay(Pipeline(path), probe_shape.timeline(plan, REQUEST))
    reads = [fp.Read(at, item.data) for at, item in out
             if isinstance(item, Chunk) and item.direction is DOWN]  # fmt: skip
    frames = [write.at for write in plan.writes if write.kind == "frame"]
    return fp.hold(plan, frames, fp.decode(reads), period=shape.period)


def idle_of(path: list[Fault], silence: float = SILENCE) -> dict[str, Any]:
    """The idle measure as the probe's record would give it: the path's close (or reset)
    of the upstream connection is the record's `client_left`."""
    shape = fp.idle_shape(silence)
    plan = probe_shape.plan(shape, http10=False, ident="t", model="middlebox-probe")
    out = replay(Pipeline(path), probe_shape.timeline(plan, REQUEST))
    frames = [write.at for write in plan.writes if write.kind == "frame"]
    left = next(((at, item) for at, item in out
                 if isinstance(item, Eof | Reset) and item.direction is UP), None)  # fmt: skip
    reads = [fp.Read(at, item.data) for at, item in out
             if isinstance(item, Chunk) and item.direction is DOWN]  # fmt: skip
    ended = any(isinstance(item, Eof | Reset) and item.direction is DOWN for _, item in out)
    written = [at for at in frames if left is None or at <= left[0]]
    record: dict[str, Any] = {"writes": {"frames": written}, "client_left": None}
    if left is not None:
        how = "rst" if isinstance(left[1], Reset) else "fin"
        record["client_left"] = {"how": how, "at": left[0], "frames_written": len(written)}
    return fp.idle(record, fp.decode(reads, ended=ended), silence)


def fingerprint(make: Any, silence: float = SILENCE) -> dict[str, Any]:
    """The measures of the path `make()` builds (a fresh one per shape, as each request
    gets its own connection); the read timeout's silence lasts `silence` seconds."""
    first, second = hold_of(HOLD_A, make()), hold_of(HOLD_B, make())
    held: dict[str, Any] = {"release": fp.release(first, second), "shapes": [first, second]}
    if first["release"] not in ("none", "incomplete"):
        held["x_accel_buffering_honoured"] = fp.accel_honoured(first, hold_of(ACCEL, make()))
    return {"hold": held, "idle": idle_of(make(), silence)}


@settings(max_examples=25, deadline=None)
@given(
    buffer=st.integers(min_value=1536, max_value=12 * 1024),
    timeout=st.floats(min_value=0.2, max_value=30.0),
    honour=st.booleans(),
)
def test_a_buffer_and_a_read_timeout_are_recovered_within_the_stated_tolerance(
    buffer: int, timeout: float, honour: bool
) -> None:
    def make() -> list[Fault]:
        buffering = ProxyBuffering(
            buffer_size=buffer, buffers_size=buffer, honour_x_accel_buffering=honour
        )
        return [buffering, IdleReaper(timeout=timeout)]

    measures = fingerprint(make)
    fitted = fit.fit(measures)
    buffering = fitted.config("proxy_buffering")
    reaper = fitted.config("idle_reaper")
    assert buffering is not None and reaper is not None, fitted
    uncertainty = measures["hold"]["release"]["uncertainty"]
    # the stated tolerance: one frame of the larger shape (519 wire bytes)
    assert uncertainty <= 519
    assert abs(buffering["buffer_size"] - buffer) <= uncertainty
    assert buffering.get("honour_x_accel_buffering", True) is honour
    assert abs(reaper["timeout"] - timeout) <= 0.001
    assert reaper["after_headers"] == "close"
    scenario = compose.load_text(fit.scenario_text(fitted, name="fitted", url="http://p/v1"))
    assert [spec.name for spec in scenario.path] == ["proxy_buffering", "idle_reaper"]
    assert fitted.not_fitted == []


@settings(max_examples=10, deadline=None)
@given(window=st.floats(min_value=0.1, max_value=0.4))
def test_a_timer_is_recovered_as_a_coalescer_window(window: float) -> None:
    measures = fingerprint(lambda: [Coalescer(window=window, size=1_000_000)])
    coalescer = fit.fit(measures).config("coalescer")
    assert coalescer is not None
    assert fit._agrees("hold_seconds", coalescer["window"], window)


def test_a_buffer_larger_than_both_answers_is_fitted_larger_than_them() -> None:
    measures = fingerprint(lambda: [ProxyBuffering(buffer_size=65536, buffers_size=65536)])
    buffering = fit.fit(measures).config("proxy_buffering")
    assert buffering is not None and buffering["buffer_size"] >= 2 * 25_031


def test_a_bare_path_fits_an_empty_path_and_says_the_timeout_was_not_seen() -> None:
    fitted = fit.fit(fingerprint(list))
    assert fitted.path == []
    assert fitted.not_fitted == [
        "idle: no read timeout within the 60.0 s silence the budget allowed; none fitted "
        "(a longer timeout, or none, looks the same: run with a larger --budget to see it)"
    ]
    assert compose.load_text(fit.scenario_text(fitted, name="bare", url="u")).path == ()


def test_the_tolerances_are_calibrates() -> None:
    for measure, (absolute, relative, unit) in fit.TOLERANCES.items():
        tolerance, calibrate_unit = CALIBRATE[fit.CALIBRATE_NAMES[measure]]
        assert (tolerance.absolute, tolerance.relative) == (absolute, relative)
        assert calibrate_unit == unit


# -- what no fault expresses: must and must not ------------------------------------------------


def framing_measure(**fields: Any) -> dict[str, Any]:
    found = {"upstream_version": "HTTP/1.1", "upstream_framing": "chunked",
             "client_version": "HTTP/1.1", "client_framing": "chunked", "client_chunks": 50,
             "upstream_chunks": 50, "rechunked": False}  # fmt: skip
    found.update(fields)
    return found


NOTHING = {"release": {"held": False, "by": "nothing"}, "shapes": []}


def test_rechunking_without_a_hold_is_said_with_its_measure() -> None:
    fitted = fit.fit({"hold": NOTHING,
                      "framing": framing_measure(client_chunks=7, rechunked=True)})  # fmt: skip
    assert fitted.path == []
    assert fitted.not_fitted == [
        "framing: the client got 7 chunks for the probe's 50 without a hold; no fault "
        "re-chunks a chunked body (an SSE client reads across chunks, so its events are the "
        "same)"
    ]


def test_chunks_passed_as_written_or_an_http10_leg_need_no_line() -> None:
    assert fit.fit({"hold": NOTHING, "framing": framing_measure()}).not_fitted == []
    http10 = framing_measure(upstream_version="HTTP/1.0", upstream_framing="close",
                             rechunked=True)  # fmt: skip
    fitted = fit.fit({"hold": NOTHING, "framing": http10})
    assert fitted.not_fitted == [] and fitted.path == [{"http10_upstream": {}}]


def whole_fingerprint(make: Any) -> dict[str, Any]:
    """The hold and the framing the probe's hold shapes show through `make()`'s path."""
    first, second = hold_of(HOLD_A, make()), hold_of(HOLD_B, make())
    held: dict[str, Any] = {"release": fp.release(first, second), "shapes": [first, second]}
    held["x_accel_buffering_honoured"] = fp.accel_honoured(first, hold_of(ACCEL, make()))
    plan = probe_shape.plan(HOLD_B, http10=False, ident="t", model="middlebox-probe")
    out = replay(Pipeline(make()), probe_shape.timeline(plan, REQUEST))
    reads = [fp.Read(at, item.data) for at, item in out
             if isinstance(item, Chunk) and item.direction is DOWN]  # fmt: skip
    record = {"request": {"version": "HTTP/1.1"}, "framing": plan.framing}
    return {"hold": held, "framing": fp.framing(record, plan, fp.decode(reads))}


def played_back(fitted: fit.Fitted) -> list[Fault]:
    return [REGISTRY[name](**config) for entry in fitted.path for name, config in entry.items()]


@pytest.mark.parametrize("honour", [False, True])
def test_a_whole_answer_sent_with_a_length_is_fitted_as_buffer_whole_response(honour: bool) -> None:
    measures = whole_fingerprint(lambda: [BufferWholeResponse(honour_x_accel_buffering=honour)])
    assert measures["framing"]["client_framing"] == "length"
    fitted = fit.fit(measures)
    assert fitted.path == [
        {"buffer_whole_response": {"honour_x_accel_buffering": True} if honour else {}}
    ]
    assert fitted.not_fitted == []
    compose.load_text(fit.scenario_text(fitted, name="whole", url="u"))
    # played back, the fitted path agrees with the one it was fitted to on every row
    again = whole_fingerprint(lambda: played_back(fitted))
    rows = fit.agreement(fit.values(measures), fit.values(again))
    assert {row.measure for row in rows} >= {"hold_by", "client_framing"}
    assert all(row.ok for row in rows), rows


def test_a_whole_answer_passed_chunked_is_fitted_as_proxy_buffering_not_re_framed() -> None:
    measures = whole_fingerprint(lambda: [ProxyBuffering(buffer_size=65536, buffers_size=65536)])
    assert measures["framing"]["client_framing"] == "chunked"
    fitted = fit.fit(measures)
    assert [next(iter(entry)) for entry in fitted.path] == ["proxy_buffering"]
    assert fitted.not_fitted == []


def test_an_upstream_answer_with_a_length_passed_with_it_is_not_a_re_framing() -> None:
    end = {"release": {"held": True, "by": "end", "at_least_bytes": 25_031}, "shapes": []}
    framing = framing_measure(upstream_framing="length", client_framing="length")
    fitted = fit.fit({"hold": end, "framing": framing})
    assert [next(iter(entry)) for entry in fitted.path] == ["proxy_buffering"]


def test_the_expected_fingerprint_of_buffer_whole_response_holds_to_the_end() -> None:
    found = fit.expected("path:\n  - buffer_whole_response: {}\n")
    assert (found["hold_by"], found["x_accel_buffering_honoured"]) == ("end", False)


def test_an_irregular_hold_is_said_and_fits_no_fault() -> None:
    irregular = {"release": {"held": True, "by": "irregular"}, "shapes": []}
    fitted = fit.fit({"hold": irregular})
    assert fitted.path == [] and fitted.not_fitted[0].startswith("hold: bursts that agree")


def test_host_is_said_not_fitted_and_other_header_changes_are_fitted() -> None:
    request = {"added": [["X-Team", "blue"], ["Connection", "close"]], "removed": [],
               "changed": [["Host", "front:80", "10.0.0.5:8000"]]}  # fmt: skip
    response = {"added": [["Server", "nginx"]], "removed": [["X-Accel-Buffering", "no"]],
                "changed": []}  # fmt: skip
    fitted = fit.fit({"request_headers": request, "response_headers": response})
    assert fitted.path == [
        {"strip_header": {"headers": ["X-Accel-Buffering"]}},
        {"set_header": {"direction": "response", "headers": {"Server": "nginx"}}},
        {"set_header": {"direction": "request", "headers": {"X-Team": "blue"}}},
    ]
    assert fitted.not_fitted == [
        "request_headers: Host rewritten to 10.0.0.5:8000 (the path's upstream address); "
        "not fitted: a scenario's upstream has its own"
    ]
    compose.load_text(fit.scenario_text(fitted, name="headers", url="u"))


def test_a_late_leave_is_fitted_and_a_prompt_one_is_not() -> None:
    late = fit.fit({"leave": {"learned": True, "how": "fin", "after": 0.224,
                              "frames_after_close": 12}})  # fmt: skip
    assert late.path == [{"ignore_client_close": {"until": "write_fails", "cork": 0.224}}]
    never = fit.fit({"leave": {"learned": False, "at_least": 5.0, "frames_after_close": 3}})
    assert never.path == [{"ignore_client_close": {"until": "never"}}]
    prompt = {"learned": True, "how": "fin", "after": 0.001, "frames_after_close": 0}
    assert fit.fit({"leave": prompt}).path == []


# -- the closest preset: must and must not ----------------------------------------------------


def preset_path(name: str) -> list[Fault]:
    return compose.load_text(f"name: p\npath:\n  - preset: {name}\n").build_faults()


def test_nginx_defaults_fingerprint_names_nginx_default_and_no_other_hop() -> None:
    measures = fingerprint(lambda: preset_path("nginx-default"))
    measures["framing"] = framing_measure(upstream_version="HTTP/1.0", rechunked=True)
    closest = fit.closest_preset(measures, PRESETS)
    # nginx-gzip compresses only for a client that asks: the probe's requests do not
    assert closest.names == ("nginx-default", "nginx-gzip") and closest.agrees, closest
    assert closest.line().startswith(
        "Closest preset: nginx-default and nginx-gzip (indistinguishable on these measures), "
        "agreeing on all"
    )


def test_a_bare_path_is_passthrough_or_caddy_and_never_nginx() -> None:
    # a silence past Apache's 300 s tells a hop without a read timeout from both
    measures = fingerprint(list, silence=600.0)
    measures["framing"] = framing_measure()
    closest = fit.closest_preset(measures, PRESETS)
    assert set(closest.names) == {"passthrough", "caddy-default"} and closest.agrees
    assert "indistinguishable" in closest.line()
    # a 60 s silence cannot tell nginx's 60 s or Apache's 300 s read timeout from none
    shorter = fingerprint(list) | {"framing": framing_measure()}
    assert "apache-default" in fit.closest_preset(shorter, PRESETS).names
    # nginx with buffering off keeps its HTTP/1.0 leg: a bare HTTP/1.1 one is not it
    assert "nginx-streaming" not in fit.closest_preset(shorter, PRESETS).names
    older = fingerprint(list) | {"framing": framing_measure(upstream_version="HTTP/1.0")}
    assert "nginx-streaming" in fit.closest_preset(older, PRESETS).names


def test_haproxys_cork_names_haproxy_default() -> None:
    measures = fingerprint(lambda: [Coalescer(window=0.204, size=1_000_000)])
    closest = fit.closest_preset(measures, PRESETS)
    assert closest.names == ("haproxy-default",) and closest.agrees, closest


def test_a_buffer_no_preset_has_is_named_as_no_agreement() -> None:
    measures = fingerprint(
        lambda: [ProxyBuffering(buffer_size=10_000, buffers_size=10_000), IdleReaper(timeout=1)]
    )
    closest = fit.closest_preset(measures, PRESETS)
    assert not closest.agrees
    assert closest.line().startswith("No preset agrees; the nearest, nginx-default")
    assert "hold_bytes" in closest.line()


def test_agreement_takes_at_least_readings_as_bounds() -> None:
    rows = fit.agreement({"idle_timeout": "at least 9.7"}, {"idle_timeout": 60.0})
    assert rows[0].ok
    rows = fit.agreement({"idle_timeout": 1.0}, {"idle_timeout": fit.NO_TIMEOUT})
    assert not rows[0].ok
    rows = fit.agreement({"idle_timeout": 1.0}, {"idle_timeout": 1.15})
    assert rows[0].ok and rows[0].tolerance == "±0.05s or ±20%"
    assert not fit.agreement({"hold_by": "size"}, {"hold_by": "end"})[0].ok


def test_the_agreement_table_marks_only_the_measures_that_differ() -> None:
    rows = fit.agreement(
        {"hold_by": "size", "hold_bytes": 4096, "idle_timeout": 1.0},
        {"hold_by": "size", "hold_bytes": 8192, "idle_timeout": 1.02},
    )
    lines = fit.agreement_lines(rows)
    assert [line.split()[0] for line in lines if line.endswith("DIFFERS")] == ["hold_bytes"]
    assert [line.split()[0] for line in lines if line.endswith("agrees")] == [
        "hold_by", "idle_timeout",
    ]  # fmt: skip
    assert lines[-1] == "2 of 3 measures agree."


def test_many_presets_equally_far_are_not_listed_as_the_nearest() -> None:
    # no hold, an HTTP/1.1 leg and a 1 s read timeout: passthrough, caddy-default and
    # apache-default each differ on the timeout alone (nginx-streaming also on its leg)
    measures = fingerprint(lambda: [IdleReaper(timeout=1)], silence=600.0)
    measures["framing"] = framing_measure()
    closest = fit.closest_preset(measures, PRESETS)
    assert not closest.agrees and len(closest.names) > 2
    assert closest.line() == "No preset agrees: each differs on at least 1 measure."


@pytest.mark.parametrize(
    ("end", "fitted_end"), [("close", "close"), ("finish", "finish"), ("reset", "reset")]
)
def test_how_a_read_timeout_ends_the_stream_is_fitted(end: str, fitted_end: str) -> None:
    idle = idle_of([IdleReaper(timeout=2.0, after_headers=end)])  # type: ignore[arg-type]
    fitted = fit.fit({"idle": idle})
    assert fitted.path == [{"idle_reaper": {"timeout": 2.0, "after_headers": fitted_end}}]
    assert fitted.not_fitted == []


def timer_hold(honoured: bool | None) -> dict[str, Any]:
    release = {"held": True, "by": "timer", "seconds": 0.2, "uncertainty": 0.01}
    return {"release": release, "shapes": [], "x_accel_buffering_honoured": honoured}


def test_a_timer_that_x_accel_buffering_turns_off_is_said_and_one_that_stays_is_not() -> None:
    said = fit.fit({"hold": timer_hold(True)}).not_fitted
    assert said == [
        "hold: X-Accel-Buffering: no turned a timer's hold off; coalescer does not read that "
        "header, so the fitted path holds those answers too"
    ]
    assert fit.fit({"hold": timer_hold(False)}).not_fitted == []


# Apache learns of a client's FIN when the second write after it fails: 20-40 ms and 2-3
# frames at the probe's 20 ms frames, within leave_after's 50 ms of a hop that watches
WRITE_FAILED = {"learned": True, "how": "fin", "after": 0.031, "frames_after_close": 2}
WATCHED = {"learned": True, "how": "fin", "after": 0.001, "frames_after_close": 0}


def test_a_leave_learned_at_a_failed_write_names_apache_and_a_watched_one_does_not() -> None:
    bare = fingerprint(list) | {"framing": framing_measure()}
    late = fit.closest_preset(bare | {"leave": WRITE_FAILED}, PRESETS)
    assert late.names == ("apache-default",) and late.agrees, late
    assert ("leave_prompt", False, False) in [(r.measure, r.path, r.model) for r in late.rows]
    watched = fit.closest_preset(bare | {"leave": WATCHED}, PRESETS)
    assert "apache-default" not in watched.names and watched.agrees, watched
    assert {"passthrough", "caddy-default"} <= set(watched.names)


def test_a_preset_reads_as_watching_the_client_unless_it_ignores_a_close() -> None:
    prompt = {name: fit.expected(text).get("leave_prompt") for name, text in PRESETS.items()}
    assert prompt == {
        "passthrough": True, "nginx-default": True, "nginx-streaming": True, "nginx-gzip": True,
        "haproxy-default": False, "apache-default": False, "caddy-default": True,
    }  # fmt: skip
    never = fit.expected("- ignore_client_close: {until: never}")
    assert never["leave_learned"] is False and "leave_prompt" not in never
    gone = fit.values({"leave": {"learned": False, "at_least": 5.0, "frames_after_close": 9}})
    assert "leave_prompt" not in gone
    assert fit.values({"leave": WRITE_FAILED})["leave_prompt"] is False
    assert fit.values({"leave": WATCHED})["leave_prompt"] is True


def leave_after_of(path: list[Fault], closed_at: float = 0.31, period: float = 0.02) -> float:
    """Seconds from a client's FIN at `closed_at` (after the first of a timer's releases)
    to the path's close or reset of the upstream connection, on frames `period` apart (the
    probe's leave shape: 20 ms)."""
    shape = ProbeShape(frames=250, size=256, period=period)
    plan = probe_shape.plan(shape, http10=False, ident="t", model="middlebox-probe")
    items = [*probe_shape.timeline(plan, REQUEST), (closed_at, Eof(UP))]
    out = replay(Pipeline(path), sorted(items, key=lambda item: item[0]))
    return next(at for at, item in out if isinstance(item, Eof | Reset) and item.direction is UP
                and at >= closed_at) - closed_at  # fmt: skip


def test_a_late_leave_sits_upstream_of_a_timer_hold_and_plays_back_as_measured() -> None:
    # HAProxy: a 0.22 s timer's hold and a leave learned 0.233 s later, 12 frames after
    measures = fingerprint(lambda: [Coalescer(window=0.22, size=1_000_000)])
    measures["leave"] = {"learned": True, "how": "rst", "after": 0.233, "frames_after_close": 12}
    fitted = fit.fit(measures)
    assert [next(iter(entry)) for entry in fitted.path] == ["coalescer", "ignore_client_close"]
    faults = compose.load_text(fit.scenario_text(fitted, name="haproxy", url="u")).build_faults()
    played = leave_after_of(faults)
    assert fit.agreement({"leave_after": 0.233}, {"leave_after": played})[0].ok, played
    # client side of the hold the fault sees only its releases: a release or two late
    corked = fitted.config("ignore_client_close")
    assert corked is not None
    swapped = compose.load_text(
        "name: s\npath:\n"
        f"  - ignore_client_close: {{until: write_fails, cork: {corked['cork']}s}}\n"
        "  - coalescer: {direction: downstream, window: 220ms, size: 1048576}\n"
    ).build_faults()
    late = leave_after_of(swapped)
    assert not fit.agreement({"leave_after": 0.233}, {"leave_after": late})[0].ok, late


# Varnish 7.1 learns of a client's FIN at a failed write: 0.06 s and 3 frames after it at the
# probe's 20 ms frames, 0.21-0.25 s and 2 frames at 100 ms frames (docs/fingerprint.md)
VARNISH = {"learned": True, "how": "fin", "after": 0.06, "frames_after_close": 3}


def test_a_leave_a_few_writes_after_the_close_is_fitted_without_a_cork_a_later_one_with() -> None:
    assert fit.fit({"leave": VARNISH}).path == [{"ignore_client_close": {"until": "write_fails"}}]
    four = VARNISH | {"after": 0.08, "frames_after_close": 4}
    assert fit.fit({"leave": four}).path == [
        {"ignore_client_close": {"until": "write_fails", "cork": 0.08}}
    ]


def test_varnishs_fitted_leave_plays_back_as_measured_at_20_and_100_ms_frames() -> None:
    scenario = compose.load_text(
        fit.scenario_text(fit.fit({"leave": VARNISH}), name="varnish", url="u")
    )
    at_20 = leave_after_of(scenario.build_faults(), period=0.02)
    assert fit.agreement({"leave_after": 0.06}, {"leave_after": at_20})[0].ok, at_20
    at_100 = leave_after_of(scenario.build_faults(), period=0.1)
    for measured in (0.21, 0.25):
        assert fit.agreement({"leave_after": measured}, {"leave_after": at_100})[0].ok, at_100
    # the cork the fit wrote before, a time, is right at 20 ms frames only
    corked = compose.load_text(
        "name: v\npath:\n  - ignore_client_close: {until: write_fails, cork: 60ms}\n"
    ).build_faults()
    assert fit.agreement({"leave_after": 0.06}, {"leave_after": leave_after_of(corked)})[0].ok


@settings(max_examples=30, deadline=None)
@given(period=st.floats(min_value=0.01, max_value=0.2), phase=st.floats(0.05, 0.95),
       frames=st.integers(min_value=2, max_value=3))  # fmt: skip
def test_a_leave_counted_in_writes_is_learned_at_the_second_write_whatever_the_period(
    period: float, phase: float, frames: int
) -> None:
    gone = {"learned": True, "how": "fin", "after": frames * 0.02, "frames_after_close": frames}
    fitted = fit.fit({"leave": gone})
    assert fitted.path == [{"ignore_client_close": {"until": "write_fails"}}]
    faults = compose.load_text(fit.scenario_text(fitted, name="w", url="u")).build_faults()
    closed_at = 0.5 + phase * period
    after = leave_after_of(faults, closed_at=closed_at, period=period)
    assert period < after <= 2 * period + 1e-9


def varnish_response_headers(varying: list[list[str]] | None) -> dict[str, Any]:
    changes: dict[str, Any] = {"added": [["X-Varnish", "32770"], ["Via", "1.1 varnish"]],
                               "removed": [], "changed": []}  # fmt: skip
    if varying is not None:
        changes["varying"] = varying
    return changes


def test_a_header_value_that_changed_on_a_second_request_is_said_and_a_fixed_one_is_not() -> None:
    varied = fit.fit({"response_headers": varnish_response_headers([["X-Varnish", "3", "6"]])})
    written = {"X-Varnish": "32770", "Via": "1.1 varnish"}
    assert varied.path == [{"set_header": {"direction": "response", "headers": written}}]
    assert varied.not_fitted == [
        "response_headers: values that change per request (X-Varnish: 3 then 6); set_header "
        "writes the first on every one"
    ]
    assert varied.reasons[0].endswith("(the first request's values; X-Varnish changed)")
    fixed = fit.fit({"response_headers": varnish_response_headers([])})
    assert fixed.not_fitted == [] and fixed.reasons[0].endswith("(the same on two requests)")
    unknown = fit.fit({"response_headers": varnish_response_headers(None)})
    assert unknown.not_fitted == [] and "measured once" in unknown.reasons[0]
    compose.load_text(fit.scenario_text(varied, name="varnish", url="u"))
