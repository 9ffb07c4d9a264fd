"""Headless Chromium with 8 concurrent streams through the TLS proxy.

Over HTTP/1.1 Chromium opens at most six connections per origin, so two of the eight
answers wait for earlier ones to end and the scorer's perceived TTFT shows it; over HTTP/2
all eight are streams of one connection and none waits. Skips without Chromium (never
under CI=true: `needs`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from middlebox.clients import chromium_path
from middlebox.run.suite import run_suite
from tests.harness import needs

SCENARIO = """name: eight-tabs-{name}
description: Eight browser tabs stream answers from one origin at once through the TLS proxy,
  to see whether any of them waits for another.
seed: 80
upstream: {{itl: 10ms, prefill_overhead: 30ms}}
workload: {{requests: 8, concurrency: 8, max_tokens: 80, timeout: 60s, clients: [browser-tls]}}
proxy: {{tls: {{alpn: {alpn}}}}}
expect:
  client.complete: 8
"""


def perceived_ttfts(tmp_path: Path, name: str, alpn: str) -> list[float]:
    path = tmp_path / f"eight-tabs-{name}.yaml"
    path.write_text(SCENARIO.format(name=name, alpn=alpn))
    report = tmp_path / f"report-{name}"
    outcome = run_suite([str(path)], client_names=["browser-tls"], report_dir=report, jobs=1)
    document = json.loads((report / "report.json").read_text())
    (result,) = document["scenarios"][0]["results"]
    assert outcome.passed, document["scenarios"][0]
    return sorted(result["metrics"]["client.perceived_ttft_ms"])


@needs(chromium_path(), "Chromium (Debian package `chromium`, or MIDDLEBOX_CHROMIUM=PATH)")
def test_over_http1_two_of_eight_chromium_streams_wait_and_over_http2_none_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIDDLEBOX_CA_DIR", str(tmp_path / "ca"))
    http1 = perceived_ttfts(tmp_path, "http1", "[http/1.1]")
    http2 = perceived_ttfts(tmp_path, "http2", "[h2, http/1.1]")
    assert len(http1) == len(http2) == 8
    # An answer of 80 tokens 10 ms apart lasts about 800 ms: the two queued requests'
    # first text comes after an earlier answer's end, the six others' right away.
    first_six = statistics.median(http1[:6])
    assert min(http1[6:]) > first_six + 500, http1
    assert max(http1[:6]) < min(http1[6:]), http1
    # Over HTTP/2 nobody waits for an answer to end.
    assert max(http2) < statistics.median(http2) + 500, http2
