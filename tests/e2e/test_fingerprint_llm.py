"""`middlebox fingerprint` against a real LLM server (the embedded vLLM emulator, a process of
its own on loopback), directly and through `middlebox proxy` with nginx's default
buffering: the path's bursts are its 4 KiB buffer, directly one token a burst; a client that
leaves is noticed by the server through both (read from the emulator's /metrics, which has
vLLM's names); what needs the probe is named as not measured; `--write` is refused with one
line and nothing written; the probe upstream is still measured as the probe. Bounded: each
run has a budget, every process is stopped by its PID."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from middlebox.tools import fingerprint_llm
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.proxy_process import emulator_process, middlebox_proxy

BUDGET = 30.0


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with emulator_process() as url:
        yield url


def test_directly_one_token_a_burst_and_the_server_stops_for_a_client_that_leaves(
    emulator: str,
) -> None:
    model = fingerprint_llm.served_model(f"{emulator}/v1", None)
    assert model == "middlebox/emulated-7b"
    found = fingerprint_llm.fingerprint(f"{emulator}/v1", model=model, budget=BUDGET)
    said = "\n".join(found["summary"])  # what a failure shows
    stream = found["measures"]["stream"]
    assert stream["burst_events"]["value"] == 1, said
    assert 0.05 <= stream["ttft"]["value"] <= 2.0, said
    cancel = found["measures"]["cancel"]
    assert cancel["stopped"] is True and cancel["after"] <= 1.0, said
    assert found["metrics"] == f"{emulator}/metrics"
    assert "This path holds" not in said  # without --direct there is nothing to compare
    assert "they need --direct URL" in said
    assert said.count("Not measured: ") == len(fingerprint_llm.measures.UNMEASURABLE) + 1


def test_through_nginx_default_buffering_the_bursts_are_its_4_kib(
    emulator: str, tmp_path: Path
) -> None:
    port = int(emulator.rsplit(":", 1)[1])
    with middlebox_proxy(tmp_path, port, "  - preset: nginx-default\n", "nginx") as front:
        found = fingerprint_llm.fingerprint(
            f"http://127.0.0.1:{front}/v1", model="middlebox/emulated-7b",
            direct=f"{emulator}/v1", budget=2 * BUDGET,
        )  # fmt: skip
    said = "\n".join(found["summary"])
    through = found["measures"]["stream"]
    assert through["burst_events"]["value"] >= 8, said
    # nginx's 4 KiB buffer counts the chunk framing too: a burst decodes to a little less
    assert 3000 <= through["burst_bytes"]["value"] <= 4096, said
    assert found["direct"]["measures"]["stream"]["burst_events"]["value"] == 1, said
    adds = found["path_adds"]
    assert adds["held"] is True and adds["ttft"]["value"] > 0.1, said
    assert found["summary"][1].startswith("This path holds ~"), said
    assert found["measures"]["response_headers"] == {"added": [], "removed": [], "changed": []}
    assert found["measures"]["compression"]["compresses"] is False, said
    for part in (found["measures"], found["direct"]["measures"]):
        assert part["cancel"]["stopped"] is True and part["cancel"]["after"] <= 2.0, said
    assert "A client that leaves through the path is noticed by the server" in said
    assert "A client that leaves directly is noticed by the server" in said
    assert "they need --direct URL" not in said


def test_the_command_refuses_write_in_one_line_and_writes_nothing(
    emulator: str, tmp_path: Path
) -> None:
    out = tmp_path / "path.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "middlebox", "fingerprint", f"{emulator}/v1", "--write", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith("Error: --write fits a scenario from the probe upstream")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_probe_upstream_is_not_taken_for_an_llm_server() -> None:
    with ProbeUpstream("127.0.0.1", 0) as probe:
        assert fingerprint_llm.served_model(f"http://127.0.0.1:{probe.port}/v1", None) is None
        given = fingerprint_llm.served_model(f"http://127.0.0.1:{probe.port}/v1", "chat")
    assert given == "chat"  # --model says so whatever the server lists


def test_the_command_prints_the_summary_and_writes_the_same_as_json(
    emulator: str, tmp_path: Path
) -> None:
    out = tmp_path / "fp.json"
    done = subprocess.run(
        [sys.executable, "-m", "middlebox", "fingerprint", f"{emulator}/v1", "--budget", "15",
         "--json", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["server"] == "llm" and document["model"] == "middlebox/emulated-7b"
    assert done.stdout.splitlines() == document["summary"]
    assert "fingerprint: measuring cancellation" in done.stderr  # the progress line


def test_through_nginx_gzip_the_compressed_stream_is_held(emulator: str, tmp_path: Path) -> None:
    port = int(emulator.rsplit(":", 1)[1])
    with middlebox_proxy(tmp_path, port, "  - preset: nginx-gzip\n", "gzip") as front:
        found = fingerprint_llm.fingerprint(
            f"http://127.0.0.1:{front}/v1", model="middlebox/emulated-7b", budget=BUDGET
        )
    said = "\n".join(found["summary"])
    squeezed = found["measures"]["compression"]
    assert (squeezed["asked"], squeezed["unasked"], squeezed["flush"]) == ("gzip", None, "held")
    assert "It compresses the event stream with gzip when asked: the compressed bytes are held" in (
        said
    )
