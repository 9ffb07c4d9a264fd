"""`middlebox fingerprint` through a real lighttpd (Debian's, started as `python -m
calibrate.fingerprints` starts it: mod_proxy with no options) in front of a real probe
upstream; no preset models lighttpd. With its default `server.stream-response-body 0` it
reads the backend's whole answer before the client gets any of it and sends it with a
`Content-Length` (the chunked upstream answer re-framed), ignoring `X-Accel-Buffering: no`;
the fit expresses it with `buffer_whole_response`, and the fitted scenario, played back
through `middlebox proxy` (`--verify`), agrees on every measure, that framing included. With
`server.stream-response-body 2` it holds nothing and the probe learns of a client's leave.
Skipped where lighttpd is not installed, never under CI=true (.ci/run installs it). Bounded
by the budget."""

from __future__ import annotations

from pathlib import Path

from calibrate.proxies import Setup, binary, running
from middlebox.tools.fingerprint import fingerprint, verify_scenario, write_scenario
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.harness import needs

pytestmark = needs(binary("lighttpd"), "lighttpd")
BUDGET = 16.0


def test_lighttpd_defaults_hold_the_whole_answer_and_send_it_with_a_length(
    tmp_path: Path,
) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        running(Setup("lighttpd"), probe.port, tmp_path / "lighttpd") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=BUDGET)
    said = "\n".join(found["summary"])
    measures = found["measures"]
    # the hold shapes send ~12 and ~25 KiB over ~1 s: none of it before the end
    assert measures["hold"]["release"]["by"] == "end", said
    assert measures["hold"]["release"]["at_least_bytes"] > 20000, said
    assert measures["hold"]["x_accel_buffering_honoured"] is False, said
    framing = measures["framing"]
    assert (framing["upstream_version"], framing["upstream_framing"]) == ("HTTP/1.1", "chunked")
    assert (framing["client_framing"], framing["rechunked"]) == ("length", True), said
    added = {name for name, _ in measures["request_headers"]["added"]}
    assert {"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Host"} <= added
    assert ["transfer-encoding", "chunked"] in measures["response_headers"]["removed"]
    # it reads the backend to the end, client or not: the probe never learns of the leave
    assert measures["leave"]["learned"] is False, said
    fitted = write_scenario(found, tmp_path / "path.yaml")
    assert fitted.config("buffer_whole_response") == {}
    assert fitted.config("proxy_buffering") is None
    assert fitted.config("ignore_client_close") == {"until": "never"}
    assert not any("Content-Length" in line for line in fitted.not_fitted), fitted.not_fitted
    rows = verify_scenario(found, tmp_path / "path.yaml", budget=BUDGET)
    table = "\n".join(f"{row.measure}: {row.path} / {row.model} {row.ok}" for row in rows)
    assert {row.measure for row in rows if not row.ok} == set(), table
    assert {"hold_by", "client_framing", "x_accel_buffering_honoured", "leave_learned"} <= {
        row.measure for row in rows if row.ok
    }, table


def test_lighttpd_streaming_holds_nothing_and_passes_a_client_s_leave(tmp_path: Path) -> None:
    setup = Setup("lighttpd", buffering=False)  # server.stream-response-body = 2
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        running(setup, probe.port, tmp_path / "lighttpd") as port,
    ):
        # the leave needs 8 s of the budget left after the two ~1 s hold shapes
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=12.0)
    said = "\n".join(found["summary"])
    measures = found["measures"]
    assert measures["hold"]["release"] == {"held": False, "by": "nothing"}, said
    assert measures["framing"]["client_framing"] == "chunked", said
    assert "leave" in measures, found["not_measured"]
    assert measures["leave"]["learned"] is True and measures["leave"]["after"] < 1.0, said
    fitted = write_scenario(found, tmp_path / "path.yaml")
    assert fitted.config("proxy_buffering") is None
    assert fitted.config("buffer_whole_response") is None
