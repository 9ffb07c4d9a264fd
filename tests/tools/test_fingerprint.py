"""`middlebox fingerprint`'s bad input: nothing listening, a front door that answers an HTML
error page, one whose upstream streams but keeps no probe records; each is one line that says
what to do, exit status 1, no traceback, and no JSON file. A fitted scenario is written whole
or not at all (an unwritable place, a fit the loader refuses), and one the proxy refuses is
one line from --verify. And how a base URL is read.
Loopback servers in threads; every socket has a timeout."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from middlebox import compose
from middlebox.scenario import fit
from middlebox.tools.fingerprint import (
    FingerprintError,
    Target,
    fingerprint,
    measure,
    playback_wait,
    verify_scenario,
    write_scenario,
)
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.run.http_stub import stub_upstream


class HtmlErrors(BaseHTTPRequestHandler):
    """A web server that is not an OpenAI route: an HTML 404 for everything."""

    def reply(self, status: int, kind: str, body: bytes) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.reply(404, "text/html", b"<html><body><h1>404 Not Found</h1></body></html>")

    do_POST = do_GET

    def log_message(self, *_: object) -> None:
        pass


class StreamWithoutRecords(HtmlErrors):
    """An upstream that streams (any LLM server) but has no probe records."""

    def do_POST(self) -> None:
        self.reply(200, "text/event-stream", b'data: {"text":"hi"}\n\ndata: [DONE]\n\n')


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    with stub_upstream(handler) as upstream:
        yield int(upstream.base_url.rsplit(":", 1)[1])


@contextmanager
def refusing_port() -> Iterator[int]:
    """A port bound and not listening: a connect to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def command(url: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "middlebox", "fingerprint", url, "--budget", "20",
         "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def one_line_error(done: subprocess.CompletedProcess[str], out: Path) -> str:
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert not out.exists() and not list(out.parent.glob("*.partial"))
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1
    return errors[0]


def test_nothing_listening_is_one_line_naming_the_url(tmp_path: Path) -> None:
    with refusing_port() as port:
        said = one_line_error(command(f"http://127.0.0.1:{port}/v1", tmp_path / "f.json"),
                              tmp_path / "f.json")  # fmt: skip
    assert f"cannot connect to http://127.0.0.1:{port}/v1 (Connection refused)" in said


def test_an_html_404_is_one_line_asking_for_the_base_url(tmp_path: Path) -> None:
    with serving(HtmlErrors) as port:
        said = one_line_error(command(f"http://127.0.0.1:{port}/v1", tmp_path / "f.json"),
                              tmp_path / "f.json")  # fmt: skip
    assert "answered 404 (text/html)" in said and "OpenAI base URL" in said


def test_a_front_door_without_probe_records_is_named_as_such() -> None:
    with (
        serving(StreamWithoutRecords) as port,
        pytest.raises(FingerprintError, match="no probe record at /v1/probe/requests/"),
    ):
        fingerprint(f"http://127.0.0.1:{port}/v1", budget=20)


def test_a_playback_takes_the_long_waits_the_path_took_as_long_and_no_other() -> None:
    # the path waited 2 s before the head and took no duration cap: the playback waits
    # as long whatever its budget left, takes no cap and does not name it as not measured;
    # the same budget without `like` fits neither long wait after the short measures
    path = {"head_idle": {"cut": False, "at_least": 2.0, "client_saw": "complete"}}
    with ProbeUpstream("127.0.0.1", 0) as probe:
        target = Target.parse(f"http://127.0.0.1:{probe.port}/v1")
        played = measure(target, 12.0, lambda line: None, like=path)
        alone = measure(target, 12.0, lambda line: None)
    assert played["measures"]["head_idle"] == path["head_idle"]
    assert "duration_cap" not in played["measures"] and "idle" not in played["measures"]
    assert played["not_measured"] == []
    assert "head_idle" not in alone["measures"]
    assert "a duration cap (the budget ran out)" in alone["not_measured"]


def test_a_playback_waits_past_the_cut_the_path_saw() -> None:
    assert playback_wait({"cut": False, "at_least": 5.4}) == 5.4
    assert playback_wait({"cut": True, "timeout": 1.0, "end": "status 504"}) == 1.75
    assert playback_wait({"cut": True, "limit": 2.0, "uncertainty": 0.1}) == 3.0


def test_a_url_that_is_not_http_is_refused_before_any_connection() -> None:
    with pytest.raises(FingerprintError, match="expected an http:// or https:// base URL"):
        Target.parse("ftp://example.com/v1")


@pytest.mark.parametrize(
    ("url", "chat", "records"),
    [
        ("http://h:8000/v1", "/v1/chat/completions", "/v1/probe/requests/x"),
        ("http://h:8000", "/v1/chat/completions", "/probe/requests/x"),
        ("https://h/probe-llm/v1/", "/probe-llm/v1/chat/completions",
         "/probe-llm/v1/probe/requests/x"),
        ("http://h/v1/chat/completions", "/v1/chat/completions", "/v1/probe/requests/x"),
    ],
)  # fmt: skip
def test_a_base_url_gives_the_chat_route_and_the_records_route_under_its_prefix(
    url: str, chat: str, records: str
) -> None:
    target = Target.parse(url)
    assert (target.chat, target.records("x")) == (chat, records)


def test_the_host_header_leaves_out_the_schemes_default_port() -> None:
    assert Target.parse("https://h/v1").host_header == "h"
    assert Target.parse("http://h:8000/v1").host_header == "h:8000"


# -- --write and --verify: whole or nothing, one line on failure --------------------------------

BUFFERED = {
    "url": "http://front/v1",
    "measures": {
        "hold": {"release": {"held": True, "by": "size", "bytes": 4096, "uncertainty": 256},
                 "shapes": [], "x_accel_buffering_honoured": True},
        "idle": {"cut": True, "timeout": 1.0, "how": "fin", "client_saw": "truncated"},
    },
}  # fmt: skip


def test_the_written_scenario_loads_and_the_document_says_what_was_fitted(tmp_path: Path) -> None:
    document = json.loads(json.dumps(BUFFERED))
    fitted = write_scenario(document, tmp_path / "path.yaml")
    scenario = compose.load(tmp_path / "path.yaml")
    assert [spec.name for spec in scenario.path] == ["proxy_buffering", "idle_reaper"]
    assert scenario.path[0].config["buffer_size"] == 4096
    assert scenario.path[1].config["timeout"] == 1.0
    assert document["fit"]["path"] == fitted.path and document["fit"]["not_fitted"] == []
    assert list(tmp_path.iterdir()) == [tmp_path / "path.yaml"]


def test_an_unwritable_scenario_path_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "path.yaml"
    with pytest.raises(FingerprintError, match=r"path\.yaml: cannot write \(No such file"):
        write_scenario(json.loads(json.dumps(BUFFERED)), target)
    assert list(tmp_path.iterdir()) == []


def test_a_fit_the_loader_refuses_is_an_error_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fit, "scenario_text", lambda *_, **__: "name: x\npath:\n  - nope: {}\n")
    with pytest.raises(FingerprintError, match=r"the fitted scenario does not load: .*nope"):
        write_scenario(json.loads(json.dumps(BUFFERED)), tmp_path / "path.yaml")
    assert list(tmp_path.iterdir()) == []


def test_verify_without_write_is_a_usage_error_before_any_measure() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "middlebox", "fingerprint", "http://127.0.0.1:9/v1", "--verify"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--verify plays the scenario --write writes" in done.stderr
    assert "cannot connect" not in done.stderr


def test_a_scenario_the_proxy_refuses_is_one_line_with_the_proxys_reason(tmp_path: Path) -> None:
    broken = tmp_path / "path.yaml"
    broken.write_text("name: broken\npath:\n  - proxy_buffering: {buffer_size: -1}\n")
    with pytest.raises(FingerprintError, match="cannot verify: middlebox proxy --scenario") as said:
        verify_scenario(json.loads(json.dumps(BUFFERED)), broken, budget=10)
    assert "buffer_size: a size cannot be negative" in str(said.value)
    assert "\n" not in str(said.value)
