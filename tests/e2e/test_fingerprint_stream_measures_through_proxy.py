"""`middlebox fingerprint`'s stream measures through a real `middlebox proxy` process in front
of a real probe upstream, each with the fault that produces it: gzip flushed per read (and
Last-Event-ID and `retry:` lines removed) must be measured so and fitted back to the same
faults, and no timeout before the head, no cap and no read timeout; a hop that drains the
upstream must be found deaf to a client's FIN and to its reset; a read timeout must be
timed before the head with its status page, and a duration cap found as the one cut.
The bare path (tests/e2e/test_fingerprint_through_proxy.py) must show none of it.
Bounded: each run has a budget, every socket a timeout; loopback only."""

from __future__ import annotations

from pathlib import Path

from middlebox.scenario import fit
from middlebox.tools.fingerprint import fingerprint
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.proxy_process import middlebox_proxy

SSE_AND_GZIP = (
    "  - gzip_encoding: {flush: sync}\n"
    "  - sse_retry: {mode: strip}\n"
    "  - sse_ids: {mode: renumber, start: 100}\n"
    "  - strip_header: {direction: request, headers: [Last-Event-ID]}\n"
)
DRAINS = "  - ignore_client_close: {until: never}\n"


def test_gzip_and_the_sse_fields_are_measured_and_fitted_back(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, SSE_AND_GZIP, "sse") as port,
    ):
        # the budget leaves the long waits their share: none of these faults cuts them
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=24)
    measures, said = found["measures"], "\n".join(found["summary"])
    for wait in ("head_idle", "duration_cap", "idle"):
        assert measures[wait]["cut"] is False and measures[wait]["at_least"] >= 2.0, said
    squeezed = measures["compression"]
    assert (squeezed["asked"], squeezed["unasked"], squeezed["flush"]) == (
        "gzip", None, "per-frame",
    ), said  # fmt: skip
    # the hold shapes ask for no compression: they pass as written
    assert measures["hold"]["release"]["by"] == "nothing", said
    fields = measures["sse_fields"]
    assert fields["heartbeats"]["verdict"] == "passed", said
    assert fields["retry"]["verdict"] == "removed", said
    assert fields["id"]["verdict"] == "changed" and fields["id"]["arrived"][0] == "100", said
    assert fields["last_event_id"]["verdict"] == "removed", said
    assert "SSE fields: heartbeats passed (3 of 3); retry: lines removed;" in said
    fitted = fit.fit(measures)
    assert fitted.config("gzip_encoding") == {"flush": "sync"}
    assert fitted.config("sse_retry") == {"mode": "strip"}
    assert fitted.config("sse_ids") == {"mode": "renumber", "start": 100}
    assert {"strip_header": {"headers": ["Last-Event-ID"], "direction": "request"}} in fitted.path


def test_a_hop_that_drains_the_upstream_hears_neither_a_fin_nor_a_reset(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, DRAINS, "drains") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=20)
    measures, said = found["measures"], "\n".join(found["summary"])
    for key in ("leave", "leave_rst"):
        assert measures[key]["learned"] is False, said
        assert measures[key]["frames_after_close"] > 100, said
    assert measures["compression"]["compresses"] is False, said
    assert "A client that resets its connection is not noticed by the upstream within 5.0 s" in said
    assert fit.fit(measures).config("ignore_client_close") == {"until": "never"}


REAPER = '  - idle_reaper: {timeout: 1s, before_headers: "502"}\n'
CAP = "  - max_duration: {limit: 2500ms}\n"


def test_a_read_timeout_before_the_head_is_timed_with_its_page_and_no_cap(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, REAPER, "reaper") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=22)
    measures, said = found["measures"], "\n".join(found["summary"])
    head = measures["head_idle"]
    assert head["cut"] is True and abs(head["timeout"] - 1.0) <= 0.1, said
    assert head["end"] == "status 502", said
    assert measures["duration_cap"]["cut"] is False, said
    assert measures["duration_cap"]["at_least"] >= 2.0, said
    fitted = fit.fit(measures)
    reaper = fitted.config("idle_reaper")
    assert reaper is not None and reaper["before_headers"] == "502", fitted
    assert fitted.config("max_duration") is None
    assert not [line for line in fitted.not_fitted if line.startswith("head_idle")], fitted


def test_a_duration_cap_is_found_and_explains_the_other_cuts(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, CAP, "cap") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=22)
    measures, said = found["measures"], "\n".join(found["summary"])
    cap = measures["duration_cap"]
    assert cap["cut"] is True and abs(cap["limit"] - 2.5) <= cap["uncertainty"], said
    assert cap["client_saw"] == "truncated", said
    assert "a duration cap" in said
    fitted = fit.fit(measures)
    assert fitted.config("max_duration") == {"limit": cap["limit"]}, fitted
    assert fitted.config("idle_reaper") is None, fitted
