"""`middlebox run` end to end: real emulator, real proxies, real client processes.

These are the issue's acceptance checks for the main job: verdicts that tell the
clients apart as reality does, waste with and without abort-on-disconnect, the same
verdicts from the same seed, and a failing `expect:` that CI can see.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from middlebox.clients import chromium_path
from middlebox.library import scenario_dir
from middlebox.report.scorecard import verdict_sections
from middlebox.run.outcome import report_document
from middlebox.run.processes import EmulatorProcess
from middlebox.run.suite import run_suite
from tests.harness import needs
from tests.process_tree import child_pids, command_line, gone, kill, survivors, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = scenario_dir()


def verdicts_of(suite: object) -> dict[str, dict[str, list[str]]]:
    return {
        outcome.scenario.name: {s.client: s.verdicts()["requests"] for s in outcome.scores}
        for outcome in suite.outcomes  # type: ignore[attr-defined]
    }


def test_the_verdicts_tell_the_built_in_clients_apart_as_reality_does() -> None:
    suite = run_suite(
        [LIBRARY / "clean-close-without-done.yaml", LIBRARY / "reset-mid-stream.yaml"],
        client_names=["raw", "openai", "resilient"],
        jobs=2,
    )
    verdicts = verdicts_of(suite)
    # A clean close without [DONE]: only a client that checks finish_reason notices.
    assert verdicts["clean-close-without-done"] == {
        "raw": ["silent_truncation"],
        "openai": ["silent_truncation"],
        "resilient": ["complete"],
    }
    # An RST mid-stream: the openai client raises; raw trusts what came; resilient retries.
    assert verdicts["reset-mid-stream"] == {
        "raw": ["silent_truncation"],
        "openai": ["truncation_detected"],
        "resilient": ["complete"],
    }
    assert suite.passed, [o.problems for o in suite.outcomes]


def test_abandoning_wastes_almost_nothing_with_abort_and_a_lot_without(tmp_path: Path) -> None:
    suite = run_suite(
        [LIBRARY / "abandon-direct.yaml", LIBRARY / "abandon-no-abort.yaml"],
        client_names=["resilient"],
        jobs=2,
        report_dir=tmp_path,
    )
    wasted = {o.scenario.name: o.scores[0].metrics["server.tokens_wasted"] for o in suite.outcomes}
    assert wasted["abandon-direct"] <= 3
    assert wasted["abandon-no-abort"] >= 200
    report = json.loads((tmp_path / "report.json").read_text())
    shown = {
        s["name"]: s["results"][0]["metrics"]["server.tokens_wasted"] for s in report["scenarios"]
    }
    assert shown == wasted  # the report carries both numbers


def test_the_same_seed_gives_identical_verdicts_and_replay_confirms_them(tmp_path: Path) -> None:
    files = [LIBRARY / "cut-inside-utf8.yaml", LIBRARY / "rate-limit-storm.yaml"]
    first = run_suite(files, client_names=["raw", "resilient"], report_dir=tmp_path / "a")
    second = run_suite(files, client_names=["raw", "resilient"], report_dir=tmp_path / "b")
    one = json.loads((tmp_path / "a" / "report.json").read_text())
    two = json.loads((tmp_path / "b" / "report.json").read_text())
    assert verdict_sections(one) == verdict_sections(two)
    assert verdict_sections(one) == verdict_sections(report_document(first, one["run"]))
    assert verdicts_of(first) == verdicts_of(second)
    replay = subprocess.run(
        [sys.executable, "-m", "middlebox", "replay", str(tmp_path / "a" / "report.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "every verdict identical" in replay.stdout


def test_a_failing_expect_exits_non_zero_and_junit_names_the_check(tmp_path: Path) -> None:
    scenario = tmp_path / "too-hopeful.yaml"
    scenario.write_text(
        "name: too-hopeful\n"
        "upstream: {itl: 5ms, prefill_overhead: 20ms}\n"
        "workload: {requests: 1, max_tokens: 10}\n"
        "path:\n  - cut: {after: tokens, count: 3, end: fin}\n"
        "expect:\n  client.silent_truncations: 0\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "middlebox",
            "run",
            str(scenario),
            "--client",
            "raw",
            "--report",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "too-hopeful/raw: client.silent_truncations equals 0: got 1" in result.stdout
    junit = ElementTree.parse(tmp_path / "out" / "junit.xml").getroot()
    failures = [
        (case.get("name"), failure.get("message"))
        for case in junit.iter("testcase")
        for failure in case.iter("failure")
    ]
    # The message says what failed, why, and what to do (the symptom-first views).
    assert [name for name, _ in failures] == ["raw: client.silent_truncations equals 0"]
    message = failures[0][1] or ""
    assert message.startswith("client.silent_truncations equals 0: got 1; why: ")
    assert "fix: " in message


def test_against_a_real_server_the_journal_and_its_metrics_stand_in_for_the_ledger(
    tmp_path: Path,
) -> None:
    """`--upstream` has no emulator ledger: the expected text comes from the upstream's own
    bytes in the journal, and the server numbers from its /metrics around each client."""
    server = EmulatorProcess({"itl": "5ms", "prefill_overhead": "20ms", "seed": 3}, tmp_path)
    try:
        scenario = tmp_path / "cut.yaml"
        scenario.write_text(
            "name: cut\nworkload: {requests: 1, max_tokens: 20}\n"
            "path:\n  - cut: {after: tokens, count: 4, end: fin, match: {first: 1}}\n"
            "expect:\n  client.silent_truncations: 0\n  raw: {client.silent_truncations: 1}\n"
        )
        suite = run_suite([scenario], client_names=["raw", "resilient"], upstream_url=server.url)
    finally:
        server.stop()
    scores = {s.client: s for s in suite.outcomes[0].scores}
    assert scores["raw"].verdicts()["requests"] == ["silent_truncation"]
    assert scores["resilient"].verdicts()["requests"] == ["complete"]
    assert scores["resilient"].metrics["client.amplification"] == 2  # cut once, then retried
    assert scores["resilient"].metrics["server.tokens_generated"] >= 20
    assert suite.passed, [o.problems for o in suite.outcomes]


@needs(chromium_path(), "Chromium")
def test_a_browser_eventsource_resumes_across_the_handoff_by_itself(tmp_path: Path) -> None:
    """EventSource's own reconnect sends Last-Event-ID: against a resumable server the page
    survives the Wi-Fi to LTE reset without any retry logic, where fetch() streaming
    surfaces an error; against a server that is not resumable the page says why.

    The stream is long (120 tokens, 30 ms apart) and the handoff comes after 40 events,
    so the EventSource is reading live when it happens: had Chromium connected after the
    generation ended, the whole replay would arrive before the outage and prove nothing.
    """
    scenario = tmp_path / "wifi-to-lte-resume.yaml"
    scenario.write_text(
        "name: wifi-to-lte-resume\n"
        "upstream: {itl: 30ms, itl_jitter: 0, prefill_overhead: 50ms, resumable: true}\n"
        "workload: {requests: 1, max_tokens: 120, timeout: 40s}\n"
        "path:\n  - handoff: {after_events: 40, outage: 1s, outcome: reset}\n"
        "expect: {client.duplicated: 0}\n"
    )
    suite = run_suite(
        [scenario, LIBRARY / "healthy-baseline.yaml"],
        client_names=["browser-eventsource", "browser"],
        jobs=2,
    )
    scores = {(o.scenario.name, s.client): s for o in suite.outcomes for s in o.scores}
    resumed = scores[("wifi-to-lte-resume", "browser-eventsource")]
    assert resumed.verdicts()["requests"] == ["complete"]
    assert resumed.metrics["client.resumed"] >= 1
    assert resumed.metrics["client.amplification"] == 1
    assert scores[("wifi-to-lte-resume", "browser")].verdicts()["requests"] == [
        "truncation_detected"
    ]
    refused = scores[("healthy-baseline", "browser-eventsource")]
    # nothing shown plus an error is error_reported, whether or not generation began
    assert refused.verdicts()["requests"] == ["error_reported"] * 2
    assert all("no X-Stream-Id" in (request.error or "") for request in refused.requests)


def test_a_sigkilled_run_leaves_neither_its_emulator_nor_its_client_running(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "held.yaml"
    scenario.write_text("name: held\npath:\n  - latency: {delay: 10ms}\n")
    sleeper = f"sleeper={sys.executable} -c 'import time; time.sleep(120)'"
    run = subprocess.Popen(
        [sys.executable, "-m", "middlebox", "run", str(scenario), "--client-cmd", sleeper,
         "--report", str(tmp_path / "report")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    found: set[int] = set()

    def both_started() -> bool:
        found.update(child_pids(run.pid))
        commands = [command_line(pid) for pid in found]
        return any("vllm_emulator" in c for c in commands) and any(
            "time.sleep(120)" in c for c in commands
        )

    try:
        assert wait_for(both_started, timeout=60), [command_line(pid) for pid in found]
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        assert survivors(found, timeout=20) == set(), [command_line(pid) for pid in found]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        kill(pid for pid in found if not gone(pid))
