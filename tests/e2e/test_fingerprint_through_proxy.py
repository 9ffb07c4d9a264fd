"""`middlebox fingerprint` through a real `middlebox proxy` process with a known path in front
of a real probe upstream: it must find nginx's 4 KiB buffer within its stated tolerance,
that `X-Accel-Buffering: no` is honoured, the header the path adds on each side and the 1 s
read timeout (`idle_reaper`); through a bare path (no fault) it must find no hold, no
header change and no read timeout; through a TLS front door with middlebox's own CA, a
one-line error until the CA is trusted. Bounded: each run has a budget, every socket a
timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from middlebox.tools.fingerprint import FingerprintError, fingerprint
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.proxy_process import middlebox_proxy

BUFFERING = (
    "  - set_header: {direction: request, headers: {X-Team: blue}}\n"
    "  - set_header: {direction: response, headers: {X-Served-By: edge-1}}\n"
    "  - proxy_buffering: {}\n"
    "  - idle_reaper: {timeout: 1s}\n"
)
BUDGET = 20.0


def test_the_fingerprint_finds_the_buffer_and_the_header_changes(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, BUFFERING, "buffering") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=BUDGET)
    measures = found["measures"]
    held = measures["hold"]["release"]
    assert held["by"] == "size" and abs(held["bytes"] - 4096) <= held["uncertainty"] <= 263
    assert measures["hold"]["x_accel_buffering_honoured"] is True
    assert measures["request_headers"]["added"] == [["X-Team", "blue"]]
    assert measures["response_headers"]["added"] == [["X-Served-By", "edge-1"]]
    # set_header writes the same value on every request: asked again, nothing varies
    assert measures["request_headers"]["varying"] == []
    assert measures["response_headers"]["varying"] == []
    assert measures["framing"]["rechunked"] is False
    assert measures["leave"]["learned"] is True
    assert found["summary"][1].startswith("It holds ~4.0 KiB")
    idle = measures["idle"]
    assert idle["cut"] is True and abs(idle["timeout"] - 1.0) <= 0.1
    assert (idle["how"], idle["client_saw"]) == ("fin", "truncated")


def test_a_bare_path_shows_no_hold_no_header_change_and_no_timeout(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, "  []\n", "bare") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=16)
    measures = found["measures"]
    said = "\n".join(found["summary"])  # what a failure shows
    assert measures["hold"]["release"] == {"held": False, "by": "nothing"}, said
    assert "x_accel_buffering_honoured" not in measures["hold"]
    for headers in (measures["request_headers"], measures["response_headers"]):
        assert headers == {"added": [], "removed": [], "changed": [], "varying": []}, said
    assert measures["framing"]["rechunked"] is False
    assert measures["idle"]["cut"] is False and measures["idle"]["at_least"] >= 2.0, said
    assert measures["idle"]["client_saw"] == "complete"
    assert measures["compression"]["compresses"] is False, said
    fields = measures["sse_fields"]
    verdicts = [fields[name]["verdict"] for name in ("heartbeats", "retry", "id", "last_event_id")]
    assert verdicts == ["passed"] * 4, said
    assert measures["leave_rst"]["learned"] is True, said
    assert measures["leave_rst"]["after"] <= 0.05, said


def test_the_command_prints_both_summaries_and_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "fp.json"
    with ProbeUpstream("127.0.0.1", 0) as probe:
        url = f"http://127.0.0.1:{probe.port}/v1"
        done = subprocess.run(
            [sys.executable, "-m", "middlebox", "fingerprint", url, "--direct", url,
             "--budget", "20", "--json", str(out)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = done.stdout.strip().splitlines()
    assert said.count("Directly, without the path:") == 1
    assert said[1] == "It holds nothing: every frame reaches the client as it is written."
    assert "  It holds nothing: every frame reaches the client as it is written." in said
    assert "fingerprint: measuring hold" in done.stderr
    assert "fingerprint: baseline: the same measures at" in done.stderr
    document = json.loads(out.read_text())
    assert document["summary"] == said[: said.index("Directly, without the path:")]
    assert document["direct"]["measures"]["hold"]["release"]["held"] is False


def test_an_untrusted_certificate_is_one_line_and_a_trusted_one_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = ("--tls", "--ca-dir", str(tmp_path / "ca"))
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, "  []\n", "tls", tls) as port,
    ):
        url = f"https://127.0.0.1:{port}/v1"
        with pytest.raises(FingerprintError, match="its TLS certificate is not trusted"):
            fingerprint(url, budget=10)
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca" / "ca.pem"))
        measured = fingerprint(url, budget=10)
    assert measured["measures"]["hold"]["release"]["held"] is False


FITTED = (
    "  - set_header: {direction: response, headers: {X-Served-By: edge-1}}\n"
    "  - http10_upstream: {}\n"
    "  - proxy_buffering: {buffer_size: 6KiB, buffers_size: 6KiB}\n"
    "  - idle_reaper: {timeout: 1500ms}\n"
)


def test_write_then_verify_agrees_on_every_measure(tmp_path: Path) -> None:
    # a path no preset has (a 6 KiB buffer, a 1.5 s read timeout): fitted, written, played
    # back through `middlebox proxy --scenario` in front of a fresh probe, and compared
    scenario, out = tmp_path / "path.yaml", tmp_path / "fp.json"
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, FITTED, "measured") as port,
    ):
        done = subprocess.run(
            [sys.executable, "-m", "middlebox", "fingerprint", f"http://127.0.0.1:{port}/v1",
             "--budget", "14", "--write", str(scenario), "--verify", "--json", str(out)],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = done.stdout
    assert "No preset agrees; the nearest, nginx-default, differs on" in said, said
    written = scenario.read_text()
    assert "  - proxy_buffering: {buffer_size: 6" in written and "idle_reaper:" in written
    assert "  - http10_upstream: {}" in written and "X-Served-By: edge-1" in written
    document = json.loads(out.read_text())
    verified = document["verify"]
    assert verified["of"] >= 10 and verified["agreed"] == verified["of"], said
    # the playback takes the waits the path took: nothing the path measured goes unplayed
    assert verified["not_played"] == [] and "Not measured in the playback" not in said
    measures = {row["measure"] for row in verified["rows"]}
    assert {"hold_bytes", "first_frame_wait", "idle_timeout", "response_headers"} <= measures
    assert f"{verified['of']} of {verified['of']} measures agree." in said
    assert "fingerprint: verifying: the same measures through middlebox proxy" in done.stderr
