"""The whole-library table of docs/real-vllm.md from a `middlebox run --upstream URL
--report DIR` run: `python -m realvllm.library_table DIR/report.json` (stdlib only).

One row a scenario, one column a client (the default clients, then each other client the
run scored): `met` or `**not met**` with the request
verdicts, `abN`/`wN` (server.aborted, server.tokens_wasted) where the scenario abandons,
`N takes` where a failed take was taken again (middlebox.run.takes),
and each failed check as the scorer said it (notes on how a bound was judged included);
a scenario that needs the emulator is one line with the reason. The last column is the
pace the suite measured before the scenario (`paced` in report.json). The summary line
counts met runs, runs not met and scenarios that need the emulator."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CLIENTS = ("raw", "openai", "httpx-sse", "resilient", "httpx-h2", "tools-naive", "openai-tools")


def _said(check: dict[str, Any]) -> str:
    said = f"{check['name']} {check['condition']} {check['expected']}: got {check['actual']}"
    return f"{said} ({check['note']})" if check.get("note") else said


def cell(result: dict[str, Any], abandons: bool) -> str:
    verdicts = "/".join(dict.fromkeys(result["verdicts"]["requests"])) or "-"
    if abandons:
        metrics = result["metrics"]
        verdicts += f" ab{metrics.get('server.aborted')} w{metrics.get('server.tokens_wasted')}"
    if len(result.get("takes") or ()) > 1:  # a failed take was taken again (run.takes)
        verdicts += f", {len(result['takes'])} takes"
    if result["passed"]:
        return f"met ({verdicts})"
    failed = "; ".join(_said(c) for c in result["checks"] if not c["passed"])
    return f"**not met** ({verdicts}) — {failed or 'a problem (see the scenario)'}"


def _problems_for(scenario: dict[str, Any], client: str) -> list[str]:
    """The scenario's problems that count against `client`: those naming it
    (`scenario/client: ...`) and those naming no client (the whole scenario)."""
    name = scenario["name"]
    named = [p for p in scenario.get("problems") or [] if p.startswith(f"{name}/")]
    return [
        p
        for p in scenario.get("problems") or []
        if p.startswith(f"{name}/{client}:") or p not in named
    ]


def columns(report: dict[str, Any]) -> list[str]:
    """CLIENTS, then every other client the run scored (a scenario's own, such as the
    Responses and Messages clients), in the order they first appear: no run is left out."""
    seen = [r["client"] for s in report["scenarios"] for r in s.get("results") or ()]
    return [*CLIENTS, *(c for c in dict.fromkeys(seen) if c not in CLIENTS)]


def rows(report: dict[str, Any]) -> tuple[list[str], dict[str, int]]:
    counts = {"met": 0, "not met": 0, "needs the emulator": 0, "needs a larger context": 0}
    clients = columns(report)
    lines = [
        "| scenario | " + " | ".join(clients) + " | server ms/token, tokens/frame, max_tokens |",
        "|---" * (len(clients) + 2) + "|",
    ]
    for scenario in report["scenarios"]:
        name = scenario["name"]
        if scenario.get("needs_emulator"):
            counts["needs the emulator"] += 1
            lines.append(f"| {name} | needs the emulator: {scenario['needs_emulator']} |")
            continue
        if scenario.get("needs_context"):
            counts["needs a larger context"] += 1
            lines.append(f"| {name} | {scenario['needs_context']} |")
            continue
        if scenario.get("problems"):
            name += " — " + "; ".join(scenario["problems"])
        results = {r["client"]: r for r in scenario["results"]}
        abandons = any(
            r["metrics"].get("client.abandoned") for r in results.values() if r.get("metrics")
        )
        cells = []
        for client in clients:
            result = results.get(client)
            if result is None:
                cells.append("")
                continue
            met = result["passed"] and not _problems_for(scenario, client)
            counts["met" if met else "not met"] += 1
            cells.append(cell(result, abandons))
        paced = scenario.get("paced") or {}
        pace = ", ".join(
            str(paced.get(k)) for k in ("server_ms_per_token", "tokens_per_frame", "max_tokens")
        )
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {pace} |")
    return lines, counts


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[0]).read_text())
    lines, counts = rows(report)
    print("\n".join(lines))
    runs = counts["met"] + counts["not met"]
    print(
        f"\n{counts['met']}/{runs} scenario-client runs met their expectations; "
        f"{counts['not met']} not met; {counts['needs the emulator']} scenarios need the emulator; "
        f"{counts['needs a larger context']} need a larger context"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
