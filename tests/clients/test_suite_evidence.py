"""tests/clients/suite_evidence.py: a failing subset run's message shows what each proxy saw."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.clients.suite_evidence import (
    connection_lines,
    failure_evidence,
    scenario_run_dir,
    upstream_lines,
    user_agent,
)


def head(
    connection: int, leg: str, direction: str, start_line: str, headers: Any
) -> dict[str, Any]:
    return {
        "type": "http_head",
        "connection": connection,
        "leg": leg,
        "direction": direction,
        "start_line": start_line,
        "headers": headers,
    }


def write_journal(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records) + "not json\n")
    return path


def stray_then_real(run: Path) -> Path:
    """A browser proxy's journal where a stray GET took the first connection and the
    page's POST came second, cut after 12 tokens."""
    return write_journal(
        run / "browser.journal.ndjson",
        [
            {"type": "open", "connection": 1, "scenario": "clean-close-without-done"},
            head(1, "client", "upstream", "GET /control HTTP/1.1", [["User-Agent", "stale"]]),
            head(1, "client", "downstream", "HTTP/1.1 404 Not Found", []),
            {
                "type": "end",
                "connection": 1,
                "leg": "client",
                "direction": "upstream",
                "kind": "read_fin",
            },
            {"type": "open", "connection": 2, "scenario": "clean-close-without-done"},
            head(
                2,
                "client",
                "upstream",
                "POST /v1/chat/completions HTTP/1.1",
                [["Host", "x"], ["user-agent", "HeadlessChrome"]],
            ),
            head(2, "upstream", "upstream", "POST /v1/chat/completions HTTP/1.1", []),
            head(2, "client", "downstream", "HTTP/1.1 200 OK", []),
            {
                "type": "fault",
                "connection": 2,
                "fault": "cut",
                "action": "cut",
                "event": 12,
                "offset": 3300,
                "time": 1.0,
            },
            {"type": "summary", "connection": 2, "bytes": {"client.downstream": 3300}},
        ],
    )


def test_the_run_directory_is_found_by_the_scenario_name(tmp_path: Path) -> None:
    (tmp_path / "runs" / "00-reset-mid-stream").mkdir(parents=True)
    (tmp_path / "runs" / "01-clean-close-without-done").mkdir()
    found = scenario_run_dir(tmp_path, "clean-close-without-done")
    assert found == tmp_path / "runs" / "01-clean-close-without-done"
    assert scenario_run_dir(tmp_path, "client-vanishes") is None


def test_the_user_agent_is_read_from_pairs_or_from_their_text() -> None:
    assert (
        user_agent([["Host", "a"], ["User-Agent", "python-httpx/0.28.1"]]) == "python-httpx/0.28.1"
    )
    assert user_agent("[['Host', 'a'], ['user-agent', 'Mozilla/5.0 (X11)']]") == "Mozilla/5.0 (X11)"
    assert user_agent([["Host", "a"]]) == "-"
    assert user_agent(None) == "-"


def test_each_connection_shows_its_requests_answers_faults_ends_and_bytes(tmp_path: Path) -> None:
    journal = stray_then_real(tmp_path / "runs" / "01-clean-close-without-done")
    first, second = connection_lines(journal)
    assert "connection 1: requests ['GET /control [stale]']" in first
    assert "answered ['404']" in first and "faults none" in first
    assert "ends ['client.upstream:read_fin']" in first
    # the upstream leg's copy of the request is not counted twice
    assert "requests ['POST /v1/chat/completions [HeadlessChrome]']" in second
    assert "answered ['200']" in second
    assert "faults [\"cut cut {'event': 12, 'offset': 3300}\"]" in second
    assert "bytes {'client.downstream': 3300}" in second


def test_a_named_client_gets_its_proxy_journal_and_the_report_is_named(tmp_path: Path) -> None:
    stray_then_real(tmp_path / "runs" / "01-clean-close-without-done")
    failure = "clean-close-without-done/browser: declared fault 'cut' fired for x but never"
    shown = failure_evidence(tmp_path, [failure], ["browser", "browser-eventsource"])
    lines = shown.splitlines()
    assert lines[0] == "clean-close-without-done/browser: what its proxy saw"
    assert lines[1].startswith("  connection 1: requests ['GET /control [stale]']")
    assert lines[2].startswith("  connection 2: ")
    assert lines[-1] == f"the run's report, journals and client stderr: {tmp_path}"


def test_a_scenario_wide_problem_shows_every_client_and_a_missing_journal_says_so(
    tmp_path: Path,
) -> None:
    stray_then_real(tmp_path / "runs" / "01-clean-close-without-done")
    problem = "clean-close-without-done: declared fault 'cut' never fired for any client"
    shown = failure_evidence(tmp_path, [problem], ["browser", "browser-eventsource"])
    assert "clean-close-without-done/browser: what its proxy saw" in shown
    assert (
        f"clean-close-without-done/browser-eventsource: no proxy journal under {tmp_path}" in shown
    )
    elsewhere = failure_evidence(tmp_path, ["client-vanishes/raw: x"], ["raw"])
    assert f"client-vanishes/raw: no proxy journal under {tmp_path}" in elsewhere


def test_failures_of_clients_that_ran_in_another_report_are_left_to_it(tmp_path: Path) -> None:
    stray_then_real(tmp_path / "runs" / "01-clean-close-without-done")
    failure = "clean-close-without-done/browser: declared fault 'cut' never fired"
    assert failure_evidence(tmp_path, [failure], ["raw", "openai"]) == ""
    assert failure_evidence(tmp_path, [], ["browser"]) == ""


def ledger_entry(tag: str, tokens: int, writes: int) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": f"{tag} Explain how server-sent events travel"}],
        "delivered_tokens": tokens,
        "write_times": [0.0] * writes,
        "finish_reason": "stop",
    }


def test_the_emulators_frames_per_token_are_shown_for_the_clients_requests(
    tmp_path: Path,
) -> None:
    run = tmp_path / "runs" / "01-clean-close-without-done"
    stray_then_real(run)
    scenario = "clean-close-without-done"
    entries = [
        ledger_entry(f"[middlebox {scenario}/browser-eventsource/0]", 3, 3),
        ledger_entry(f"[middlebox {scenario}/browser/0]", 40, 9),  # merged: 4+ a frame
    ]
    (run / "ledger.json").write_text(json.dumps(entries))
    assert upstream_lines(run / "ledger.json", scenario, "browser") == [
        "  upstream: request 0: 40 tokens delivered in 9 writes, finish stop"
    ]
    failure = f"{scenario}/browser: declared fault 'cut' fired for x but never for browser"
    shown = failure_evidence(tmp_path, [failure], ["browser"]).splitlines()
    assert shown[-2] == "  upstream: request 0: 40 tokens delivered in 9 writes, finish stop"
    assert upstream_lines(run / "missing.json", scenario, "browser") == []
