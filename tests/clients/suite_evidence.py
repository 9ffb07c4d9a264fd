"""What each client's proxy saw in a suite run, for the failure message of an e2e subset test.

The subset fixtures (test_matrix_subset.py, test_browser_subset.py) keep their run's report
directory (run_suite's REPORT/runs/NN-scenario/CLIENT.journal.ndjson) under pytest's tmp
dir. When one of their checks fails, the message says, per failing scenario and client,
which connections the proxy opened, which requests came on each (request line and
User-Agent, so a stray request from another program stands out), what the faults reported
and how the connection ended: enough to tell an intermittent failure's mechanism from the
CI log alone (a `match: {first: N}` or `connections: N` count taken by an extra request or
connection, a fault that saw fewer events than its trigger, a client that left first).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from middlebox.report.layout import safe_name

# "scenario/client: ..." (a result's failed checks, or a proof problem naming a client)
_NAMED_PAIR = re.compile(r"^(?P<scenario>[\w.-]+)/(?P<client>[\w.-]+):")
# "scenario: declared fault 'x' never fired for any client ..." (every client of it)
_SCENARIO_ONLY = re.compile(r"^(?P<scenario>[\w.-]+): ")
_USER_AGENT = re.compile(r"user-agent'?,\s*'([^']*)'", re.IGNORECASE)


def scenario_run_dir(report_dir: Path, scenario: str) -> Path | None:
    """REPORT/runs/NN-<scenario> (run_directory's layout), or None when not there."""
    wanted = safe_name(scenario)
    for run in sorted((report_dir / "runs").glob("*-*")):
        if run.is_dir() and run.name.split("-", 1)[1] == wanted:
            return run
    return None


def user_agent(headers: Any) -> str:
    """The User-Agent of a journaled head (a list of pairs, or its text)."""
    if isinstance(headers, list):
        for pair in headers:
            named = isinstance(pair, list | tuple) and len(pair) == 2
            if named and str(pair[0]).lower() == "user-agent":
                return str(pair[1])
        return "-"
    found = _USER_AGENT.search(str(headers))
    return found.group(1) if found else "-"


def connection_lines(journal: Path) -> list[str]:
    """One line per connection of a client's proxy journal: its requests, the faults'
    reports, the response statuses, how its legs ended and the bytes each way."""
    connections: dict[int, dict[str, Any]] = {}
    for raw in journal.read_text().splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        number = record.get("connection")
        if not isinstance(number, int):
            continue
        seen = connections.setdefault(
            number, {"requests": [], "statuses": [], "faults": [], "ends": [], "bytes": {}}
        )
        kind = record.get("type")
        client_leg = record.get("leg") == "client"
        if kind == "http_head" and client_leg and record.get("direction") == "upstream":
            line = str(record.get("start_line", "?")).rsplit(" ", 1)[0]
            seen["requests"].append(f"{line} [{user_agent(record.get('headers'))}]")
        elif kind == "http_head" and client_leg:
            words = str(record.get("start_line", "")).split(" ")
            seen["statuses"].append(words[1] if len(words) > 1 else "?")
        elif kind == "fault":
            detail = {k: v for k, v in record.items() if k in ("request", "event", "offset")}
            seen["faults"].append(f"{record.get('fault')} {record.get('action')} {detail}")
        elif kind == "end":
            seen["ends"].append(
                f"{record.get('leg')}.{record.get('direction')}:{record.get('kind')}"
            )
        elif kind == "summary":
            seen["bytes"] = record.get("bytes", {})
    lines = []
    for number, seen in sorted(connections.items()):
        lines.append(
            f"  connection {number}: requests {seen['requests'] or 'none'}; "
            f"answered {seen['statuses'] or 'nothing'}; faults {seen['faults'] or 'none'}; "
            f"ends {seen['ends']}; bytes {seen['bytes']}"
        )
    return lines


def upstream_lines(ledger: Path, scenario: str, client: str) -> list[str]:
    """The emulator's ledger for `client`'s requests (its tag opens the prompt): tokens
    delivered against SSE frames written. More than one token a frame means the emulator
    fell behind and merged them (a starved process catching up, as vLLM's lagging API
    server does), and a trigger counted in events may then never be reached."""
    try:
        entries = json.loads(ledger.read_text())
    except (OSError, ValueError):
        return []
    tag = f"[middlebox {scenario}/{client}/"
    lines = []
    for entry in entries if isinstance(entries, list) else []:
        prompt = entry.get("prompt")
        text = prompt[0].get("content", "") if isinstance(prompt, list) and prompt else prompt
        if not isinstance(text, str) or not text.startswith(tag):
            continue
        frames = len(entry.get("write_times") or [])
        tokens = entry.get("delivered_tokens", 0)
        lines.append(
            f"  upstream: request {text[len(tag) :].split(']')[0]}: {tokens} tokens delivered "
            f"in {frames} writes, finish {entry.get('finish_reason')}"
        )
    return lines


def failure_evidence(report_dir: Path, failures: list[str], clients: list[str]) -> str:
    """For every scenario and client of `clients` (those that ran in this report) a
    failure names, what its proxy saw (a scenario-wide problem names all `clients`); then
    where the whole report is. Empty when no failure names one of them."""
    pairs: dict[tuple[str, str], None] = {}
    for failure in failures:
        named = _NAMED_PAIR.match(failure)
        if named:
            if named["client"] in clients:
                pairs[(named["scenario"], named["client"])] = None
            continue
        scenario_only = _SCENARIO_ONLY.match(failure)
        if scenario_only:
            for client in clients:
                pairs[(scenario_only["scenario"], client)] = None
    if not pairs:
        return ""
    parts = []
    for scenario, client in pairs:
        run = scenario_run_dir(report_dir, scenario)
        journal = run / f"{client}.journal.ndjson" if run is not None else None
        if journal is None or not journal.is_file():
            parts.append(f"{scenario}/{client}: no proxy journal under {report_dir}")
            continue
        parts.append(f"{scenario}/{client}: what its proxy saw")
        parts += connection_lines(journal) or ["  no connection"]
        parts += upstream_lines(journal.parent / "ledger.json", scenario, client)
    parts.append(f"the run's report, journals and client stderr: {report_dir}")
    return "\n".join(parts)
