"""Views of a suite's verdicts: the terminal scorecard, junit.xml, and the report files.

Every view takes the plain-data report document (`middlebox.run.outcome.report_document`,
the content of `report.json`), never the runner's objects, so reporting depends on no
part of running and a saved report.json renders the same as a fresh run.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from middlebox.report.diagnosis import (
    FIGURE_LEGEND,
    SHOWN_FINDINGS,
    VERDICT_METRICS,
    check_said,
    diagnose,
    failure_message,
    figures,
    findings,
    symptoms,
)
from middlebox.report.html_page import write_html

WIDTH = 160
"""Columns every line of the terminal scorecard and progress fits in (a CI log's width)."""

SEVERITY = [
    "upstream_error",  # the server refused: nothing says how the client streams
    "hang",
    "no_result",
    "acted_on_partial_call",  # agent verdicts: run/agent_checks.py
    "side_effect_repeated",
    "acted_on_invalid_json",
    "silent_truncation",
    "mojibake",
    "duplicated",
    "contradicted",
    "missing_tokens",
    "reasoning_as_answer",
    "truncation_detected",
    "error_reported",
    "abandoned",
    "complete_then_error",
    "reasoning_hidden",
    "complete",
]
GOOD = {"complete", "abandoned"}
COLOURS = {
    "upstream_error": "red",
    "hang": "red",
    "no_result": "red",
    "acted_on_partial_call": "red",
    "side_effect_repeated": "red",
    "acted_on_invalid_json": "red",
    "reasoning_as_answer": "red",
    "reasoning_hidden": "yellow",
    "silent_truncation": "red",
    "mojibake": "red",
    "duplicated": "red",
    "contradicted": "red",
    "missing_tokens": "red",
    "truncation_detected": "yellow",
    "error_reported": "yellow",
    "abandoned": "cyan",
    "complete_then_error": "yellow",
    "complete": "green",
}
SHORT = {
    "upstream_error": "UPSTREAM-ERR",
    "hang": "HANG",
    "no_result": "NO-RESULT",
    "acted_on_partial_call": "PARTIAL-CALL",
    "side_effect_repeated": "TWICE",
    "acted_on_invalid_json": "BAD-JSON",
    "reasoning_as_answer": "REASONING",
    "reasoning_hidden": "thinking-hidden",
    "silent_truncation": "SILENT",
    "mojibake": "MOJIBAKE",
    "duplicated": "DUP",
    "contradicted": "REDRAWN",
    "missing_tokens": "MISSING",
    "truncation_detected": "detected",
    "error_reported": "error",
    "abandoned": "abandoned",
    "complete_then_error": "ok+error",
    "complete": "ok",
}


# SGR foreground colours (ECMA-48), the ones click.style would write, without click here
ANSI = {"red": 31, "green": 32, "yellow": 33, "cyan": 36, "white": 37}


def styled(text: str, colour: str) -> str:
    return f"\033[{ANSI[colour]}m{text}\033[0m"


def cell(result: dict[str, Any]) -> tuple[str, str]:
    """A short summary of one client's verdicts: the worst kind and how many had it."""
    verdicts = [request["verdict"] for request in result["requests"]]
    if not verdicts:
        return "-", "white"
    worst = min(verdicts, key=SEVERITY.index)
    text = f"{SHORT[worst]} {verdicts.count(worst)}/{len(verdicts)}"
    if result["metrics"].get("server.tokens_wasted"):
        text += f" w{result['metrics']['server.tokens_wasted']}"
    if not result["passed"]:
        text += " ✗"
    return text, COLOURS[worst] if result["passed"] else "red"


def describe(check: dict[str, Any]) -> str:
    return check_said(check)


def status_of(scenario: dict[str, Any], result: dict[str, Any] | None = None) -> str | None:
    """A run that did not produce verdicts says why (e.g. "needs the emulator: <reason>"),
    in the document's `status` field of the scenario or result; None when it ran."""
    for holder in (result or {}, scenario):
        status = holder.get("status")
        if isinstance(status, str) and status not in ("", "ran", "ok"):
            return status
    return None


def fit(text: str, indent: str = "    ", width: int = WIDTH) -> list[str]:
    """`text` as lines of at most `width` columns, continued under `indent`."""
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def _cells(row: list[str], widths: list[int]) -> str:
    return "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=False))


def symptom_table(document: dict[str, Any], width: int = WIDTH) -> list[str]:
    """Per scenario, and under it per client, next to the verdict the numbers that name the
    symptom and the diagnosis by name (Locust's stats table is the model: one dense row per
    run); what each named diagnosis means and its fix follow once, under the table
    (`diagnosis_key`). The diagnosis column wraps within `width`."""
    rows: list[tuple[str, list[str] | None]] = []  # (scenario line, or a client's row)
    for scenario in document["scenarios"]:
        status = status_of(scenario)
        if not scenario["results"]:
            if status:
                rows.append((f"{scenario['name']}: {status}", None))
            continue
        rows.append((scenario["name"], None))
        for result in scenario["results"]:
            own = status_of(scenario, result)
            named = [] if own else findings(result)[:SHOWN_FINDINGS]
            rows.append((
                "",
                ["  " + str(result["client"]), own or cell(result)[0],
                 *figures(symptoms(result)).values(),
                 "; ".join(finding.name for finding in named) or "-"],
            ))  # fmt: skip
    if not rows:
        return []
    header = ["scenario / client", "verdict", *figures(symptoms({})).keys(), "diagnosis"]
    cells = [header, *(row for _, row in rows if row is not None)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    left = sum(widths) + 2 * len(widths)
    room = max(width - left, 40)
    lines = [_cells(header, widths) + "  diagnosis"]
    for text, row in rows:
        if row is None:
            lines += fit(text, width=width)
            continue
        said = textwrap.wrap(row[-1], room, break_on_hyphens=False) or ["-"]
        lines.append(_cells(row[:-1], widths) + "  " + said[0])
        lines += [" " * left + more for more in said[1:]]
    return lines


def diagnosis_key(document: dict[str, Any], width: int = WIDTH) -> list[str]:
    """Each diagnosis the symptom table names, once: why and the usual fix."""
    keys = dict.fromkeys(
        finding.key
        for scenario in document["scenarios"]
        for result in scenario["results"]
        if not status_of(scenario, result)
        for finding in findings(result)[:SHOWN_FINDINGS]
        if finding.key
    )
    return [line for key in keys for line in fit(key, width=width)]


def matrix(
    document: dict[str, Any], clients: list[str], *, colour: bool, width: int = WIDTH
) -> list[str]:
    """The scenario x client verdicts. Each column is as wide as its own cells; when the
    columns do not fit in `width`, the clients are split into blocks of columns that do,
    each block listing the scenarios that ran one of its clients."""
    scenarios: list[dict[str, Any]] = document["scenarios"]
    grid = {
        (scenario["name"], result["client"]): cell(result)
        for scenario in scenarios
        for result in scenario["results"]
    }
    first = max([len(s["name"]) for s in scenarios] + [8]) + 2
    columns = {
        client: max([len(client)] + [len(grid[s["name"], client][0]) for s in scenarios
                                     if (s["name"], client) in grid]) + 2
        for client in clients
    }  # fmt: skip
    blocks: list[list[str]] = [[]]
    for client in clients:
        used = first + sum(columns[c] for c in blocks[-1])
        if blocks[-1] and used + columns[client] > width:
            blocks.append([])
        blocks[-1].append(client)
    lines: list[str] = []
    for number, block in enumerate(blocks):
        if number:
            lines.append("")
        lines.append(
            ("scenario".ljust(first) + "".join(c.ljust(columns[c]) for c in block)).rstrip()
        )
        for scenario in scenarios:
            name = scenario["name"]
            if not scenario["results"]:
                status = status_of(scenario)
                if number == 0:
                    said = fit(f"{name.ljust(first)}{status or '-'}", " " * first, width)
                    lines += [styled(t, "yellow") if colour and status else t for t in said]
                continue
            if not any((name, client) in grid for client in block):
                continue
            row = name.ljust(first)
            for client in block:
                text, hue = grid.get((name, client), ("-", "white"))
                padded = text.ljust(columns[client])
                row += styled(padded, hue) if colour and text != "-" else padded
            lines.append(row.rstrip())
    return lines


TAKES_LEGEND = (
    "Taken again (a failed take against a real server, or one that failed against the emulator "
    "only on a wall-clock bound, is taken again, up to three takes, and the least disturbed "
    "counts: middlebox.run.takes):"
)


def take_said(take: dict[str, Any]) -> str:
    """One take of a re-taken run: kept or not, held or why not, and its disturbance."""
    said = f"take {take['take']}{' (kept)' if take['kept'] else ''} "
    said += "held" if take["held"] else f"failed ({take.get('why_not', '')})"
    said += f", server stall {take['server_stall_ms']} ms, loop lag {take['loop_lag_ms']} ms"
    return said + (f" (gc {take['gc_pause_ms']} ms)" if take.get("gc_pause_ms") else "")


VERDICT_LEGEND = (
    "ok = complete; SILENT = reported success with text missing; detected = truncation "
    "surfaced; DUP/MISSING/MOJIBAKE = corrupted text; wN = tokens wasted upstream; ✗ = an "
    "expect: check failed"
)


def pinned_cells(document: dict[str, Any]) -> tuple[Counter[str], int]:
    """The red cells of runs that met their expectations (SILENT, HANG, ...), by their
    short verdict: those whose verdict an `expect:` check names are a client library's
    known behaviour, pinned as expected; the second count is those no check names."""
    pinned: Counter[str] = Counter()
    unchecked = 0
    for scenario in document["scenarios"]:
        for result in scenario["results"]:
            verdicts = [request["verdict"] for request in result["requests"]]
            if not result["passed"] or not verdicts:
                continue
            worst = min(verdicts, key=SEVERITY.index)
            if COLOURS[worst] != "red":
                continue
            checked = {c["name"] for c in result["checks"] if c["passed"]}
            if VERDICT_METRICS.get(worst) in checked:
                pinned[SHORT[worst]] += 1
            else:
                unchecked += 1
    return pinned, unchecked


def summary(document: dict[str, Any]) -> list[str]:
    """The last lines: how many runs met their expectations, and what the red cells of
    the runs that did are (a PASS beside SILENT and HANG cells says why it is a PASS)."""
    scenarios = document["scenarios"]
    total = sum(len(s["results"]) for s in scenarios)
    passed = sum(1 for s in scenarios for r in s["results"] if r["passed"])
    lines = [
        f"{passed}/{total} scenario-client runs met their expectations; "
        f"{'PASS' if document['passed'] else 'FAIL'}"
    ]
    pinned, unchecked = pinned_cells(document)
    if pinned:
        kinds = ", ".join(f"{name} {count}" for name, count in pinned.most_common())
        lines += fit(
            f"  of them, {sum(pinned.values())} red cells ({kinds}) are known behaviours of "
            "those client libraries, each pinned by its scenario's expect: and met as expected"
        )
    if unchecked:
        lines += fit(
            f"  {unchecked} red cells of runs that met their expectations show a verdict no "
            "expect: check names (the scenario does not judge it)"
        )
    return lines


def scorecard(document: dict[str, Any], *, colour: bool | None = None) -> str:
    """The scenario x client matrix, the symptom table (numbers and a diagnosis per run,
    then what each diagnosis means), every failed check (what, why, what to do) and
    problem, and the summary; every line fits in WIDTH columns."""
    scenarios: list[dict[str, Any]] = document["scenarios"]
    # plus the clients only some scenarios ran (a report.json written before `clients`
    # listed them all)
    ran = [r["client"] for scenario in scenarios for r in scenario["results"]]
    clients: list[str] = list(dict.fromkeys([*document["clients"], *ran]))
    lines = matrix(document, clients, colour=bool(colour))
    lines += ["", *fit(VERDICT_LEGEND)]
    table = symptom_table(document)
    if table:
        lines += ["", "Symptoms:", *table, "", *fit(FIGURE_LEGEND)]
        key = diagnosis_key(document)
        if key:
            lines += ["", "Diagnoses (why, and the usual fix):", *key]
    failures: list[str] = []
    for scenario in scenarios:
        name = scenario["name"]
        failures += [line for problem in scenario["problems"] for line in fit(f"  {problem}")]
        if scenario.get("needs_emulator"):
            lines += fit(f"{name}: needs the emulator: {scenario['needs_emulator']}")
        if scenario.get("needs_context"):
            lines += fit(f"{name}: {scenario['needs_context']}")
        for result in scenario["results"]:
            failures += [
                line
                for check in result["checks"]
                if not check["passed"]
                for line in fit(
                    f"  {name}/{result['client']}: "
                    f"{failure_message(scenario, result['client'], check)}"
                )
            ]
            never = sorted(
                set(result["faults_declared"])
                - {f.split(":")[0] for f in result["verdicts"]["faults_fired"]}
                - set(scenario.get("quiet_faults", ()))
            )
            if never:
                failures += fit(
                    f"  {name}/{result['client']}: warning: declared "
                    f"fault(s) never fired: {', '.join(never)}"
                )
    if failures:
        lines += ["", "Failed checks and problems:", *failures]
    retaken = [
        line
        for scenario in scenarios
        for result in scenario["results"]
        if len(result.get("takes") or ()) > 1
        for line in fit(
            f"  {scenario['name']}/{result['client']}: "
            + "; ".join(map(take_said, result["takes"]))
        )
    ]
    if retaken:
        lines += ["", *fit(TAKES_LEGEND), *retaken]
    lines += ["", *summary(document)]
    return "\n".join(lines)


def verdict_sections(document: dict[str, Any]) -> dict[str, Any]:
    """What must be identical across runs with the same seeds."""
    return {
        scenario["name"]: {result["client"]: result["verdicts"] for result in scenario["results"]}
        for scenario in document["scenarios"]
    }


def junit_xml(document: dict[str, Any]) -> bytes:
    """One testsuite per scenario, one testcase per (client, check); failures name the check."""
    root = ElementTree.Element("testsuites", name="middlebox")
    for scenario in document["scenarios"]:
        name = scenario["name"]
        cases = [(result, check) for result in scenario["results"] for check in result["checks"]]
        failed = sum(1 for _, check in cases if not check["passed"]) + len(scenario["problems"])
        suite_el = ElementTree.SubElement(
            root,
            "testsuite",
            name=name,
            tests=str(len(cases) + len(scenario["problems"])),
            failures=str(failed),
        )
        for problem in scenario["problems"]:
            case = ElementTree.SubElement(suite_el, "testcase", name="scenario", classname=name)
            ElementTree.SubElement(case, "failure", message=problem)
        if scenario.get("needs_emulator"):
            case = ElementTree.SubElement(suite_el, "testcase", name="scenario", classname=name)
            reason = f"needs the emulator: {scenario['needs_emulator']}"
            ElementTree.SubElement(case, "skipped", message=reason)
        if scenario.get("needs_context"):
            case = ElementTree.SubElement(suite_el, "testcase", name="scenario", classname=name)
            ElementTree.SubElement(case, "skipped", message=scenario["needs_context"])
        for result, check in cases:
            case = ElementTree.SubElement(
                suite_el,
                "testcase",
                name=f"{result['client']}: {check['name']} {check['condition']} "
                f"{check['expected']}",
                classname=f"{name}.{result['client']}",
            )
            if not check["passed"]:
                failure = ElementTree.SubElement(
                    case, "failure", message=failure_message(scenario, result["client"], check)
                )
                failure.text = f"diagnosis: {diagnose(result)}"
    xml: bytes = ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
    return xml


def write_reports(document: dict[str, Any], directory: Path) -> None:
    """report.json, junit.xml and report.html (with its timelines) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(document, indent=2, ensure_ascii=False))
    (directory / "junit.xml").write_bytes(junit_xml(document))
    write_html(document, directory)
