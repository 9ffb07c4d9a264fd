"""`report.html` and the per-run timelines: views of a suite's verdicts, written offline.

For every (scenario, client) run of a suite with a report directory this writes, next
to the run's journal, `CLIENT.timeline.json` and `CLIENT.timeline.png`
(`middlebox.report.timeline`), then one self-contained `report.html`: the scorecard, each
scenario's problems and fault proof, and per client its checks, metrics and one inline
SVG timeline per request, with relative links to the journals and PNGs. No script,
no external stylesheet, font or image: it opens from disk, offline.
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path
from typing import Any

from middlebox.observe.journal import JournalView, read_ndjson
from middlebox.report.diagnosis import FIGURE_LEGEND, diagnose, figures, symptoms, why_and_fix
from middlebox.report.layout import run_directory
from middlebox.report.timeline import (
    key_numbers,
    save_data,
    svg,
    svg_fault_marks,
    time_unit,
    timeline_data,
    write_png,
)
from middlebox.scenario.workload import request_tag

log = logging.getLogger("middlebox.report.html_page")

VERDICT_COLOURS = {
    "complete": "#2e7d32",
    "abandoned": "#00838f",
    "truncation_detected": "#b26a00",
    "error_reported": "#b26a00",
}
BAD = "#c62828"

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.pass{color:#2e7d32;font-weight:bold}.fail{color:#c62828;font-weight:bold}
.problems li{color:#c62828}.run{margin:1em 0 2em 1em}.small{font-size:12px;color:#555}
svg.timeline{border:1px solid #ddd;display:block;margin:.3em 0}
.timeline-row{display:flex;gap:1em;align-items:flex-start}
.numbers{font-size:12px;margin:.3em 0}.numbers li,.faults li{list-style:none}
.numbers ul,.faults{padding-left:0;margin:.2em 0}.faults{color:#d62728;font-size:12px}
"""


def write_timelines(document: dict[str, Any], report_dir: Path) -> dict[tuple[str, str], Any]:
    """Timeline JSON and PNG for every run whose files are there; returns the data."""
    timelines: dict[tuple[str, str], Any] = {}
    for index, scenario in enumerate(document["scenarios"]):
        directory = run_directory(report_dir / "runs", index, scenario["name"])
        ledger_file = directory / "ledger.json"
        ledger = json.loads(ledger_file.read_text()) if ledger_file.exists() else []
        for result in scenario["results"]:
            client = result["client"]
            result_file = directory / f"{client}.result.json"
            journal_file = directory / f"{client}.journal.ndjson"
            verdicts = [request["verdict"] for request in result["requests"]]
            # a result the scorer refused (it breaks the client contract) is not drawn either
            unread = not result_file.exists() or "no_result" in verdicts
            try:
                shown = None if unread else json.loads(result_file.read_text())
            except ValueError:
                shown = None
            views: list[JournalView] = read_ndjson(journal_file) if journal_file.exists() else []
            tags = [request_tag(scenario["name"], client, i) for i in range(len(verdicts))]
            data = timeline_data(
                scenario["name"], client, tags, ledger, shown, views, verdicts,
                description=str(scenario.get("description") or ""), seed=scenario.get("seed"),
            )  # fmt: skip
            directory.mkdir(parents=True, exist_ok=True)
            save_data(data, directory / f"{client}.timeline.json")
            try:
                write_png(data, directory / f"{client}.timeline.png")
            except Exception as error:  # a plot must never lose the verdicts
                log.warning("timeline PNG for %s/%s failed: %s", scenario["name"], client, error)
            timelines[(scenario["name"], client)] = data
    return timelines


def _cell(result: dict[str, Any]) -> tuple[str, str]:
    verdicts = result["verdicts"]["requests"]
    failed = [name for name, ok in result["verdicts"]["checks"].items() if not ok]
    if not verdicts:
        return "-", "#777"
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict] = counts.get(verdict, 0) + 1
    text = ", ".join(f"{name} {count}/{len(verdicts)}" for name, count in counts.items())
    worst = next((v for v in verdicts if v not in VERDICT_COLOURS), None)
    colour = BAD if failed or worst else VERDICT_COLOURS[verdicts[0]]
    if failed:
        text += " ✗"
    return text, colour


def render(document: dict[str, Any], timelines: dict[tuple[str, str], Any]) -> str:
    """The whole page as one string."""
    e = html.escape
    clients: list[str] = []
    for scenario in document["scenarios"]:
        for result in scenario["results"]:
            if result["client"] not in clients:
                clients.append(result["client"])
    verdict = "PASS" if document.get("passed") else "FAIL"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>middlebox report: {verdict}</title>",
        f"<style>{STYLE}</style></head><body>",
        f'<h1>middlebox report: <span class="{verdict.lower()}" id="verdict">{verdict}</span></h1>',
        f'<p class="small">middlebox {e(str(document.get("middlebox", "")))}, python '
        f"{e(str(document.get('python', '')))}, {e(seed_line(document))}</p>",
        '<h2>Scorecard</h2><table id="scorecard"><tr><th>scenario</th><th>seed</th>',
    ]
    out += [f"<th>{e(client)}</th>" for client in clients]
    out.append("</tr>")
    for index, scenario in enumerate(document["scenarios"]):
        by_client = {result["client"]: result for result in scenario["results"]}
        mark = ' <span class="fail">✗ problems</span>' if scenario.get("problems") else ""
        row = f'<tr><td><a href="#s{index}">{e(scenario["name"])}</a>{mark}</td>'
        row += f"<td>{e(str(scenario.get('seed')))}</td>"
        for client in clients:
            if client in by_client:
                text, colour = _cell(by_client[client])
                row += f'<td style="color:{colour}">{e(text)}</td>'
            else:
                row += "<td>-</td>"
        out.append(row + "</tr>")
    out.append("</table>")
    out += symptom_rows(document)
    for index, scenario in enumerate(document["scenarios"]):
        directory = f"runs/{run_directory(Path('.'), index, scenario['name']).name}"
        out.append(f'<h2 id="s{index}">{e(scenario["name"])}</h2>')
        out.append(
            f'<p class="small">{e(str(scenario.get("file", "")))}, seed {scenario["seed"]}</p>'
        )
        if scenario.get("description"):
            out.append(f'<p class="description">{e(str(scenario["description"]))}</p>')
        if scenario.get("problems"):
            out.append('<ul class="problems">')
            out += [f"<li>{e(problem)}</li>" for problem in scenario["problems"]]
            out.append("</ul>")
        proof = scenario.get("proof") or {}
        if proof:
            out.append("<table class=\"proof\"><tr><th>fault</th><th>fired on</th>"
                       "<th>bypassed on</th><th>clients fired</th></tr>")  # fmt: skip
            for name, counts in proof.get("faults", {}).items():
                out.append(
                    f"<tr><td>{e(name)}</td><td>{counts['fired']}</td><td>{counts['bypassed']}</td>"
                    f"<td>{e(', '.join(counts['clients_fired']))}</td></tr>"
                )
            connections = ", ".join(f"{c}: {n}" for c, n in proof.get("connections", {}).items())
            out.append(f'</table><p class="small">connections: {e(connections)}</p>')
        for result in scenario["results"]:
            client = result["client"]
            out.append(f'<div class="run"><h3>{e(scenario["name"])} / {e(client)}</h3>')
            out.append(
                f'<p class="small"><a href="{directory}/{e(client)}.journal.ndjson">journal</a> · '
                f'<a href="{directory}/{e(client)}.timeline.png">timeline PNG</a> · '
                f'<a href="{directory}/{e(client)}.result.json">client result</a></p>'
            )
            out.append(f'<p class="diagnosis">diagnosis: {e(diagnose(result))}</p>')
            if result["checks"]:
                out.append(
                    "<table><tr><th>check</th><th>expected</th><th>got</th><th></th>"
                    "<th>why / what to do</th></tr>"
                )
                for check in result["checks"]:
                    mark = (
                        '<span class="pass">ok</span>'
                        if check["passed"]
                        else '<span class="fail">failed</span>'
                    )
                    advice = ""
                    if not check["passed"]:
                        why, fix = why_and_fix(scenario, client, check)
                        advice = f"<b>why:</b> {e(why)}<br><b>fix:</b> {e(fix)}"
                    out.append(
                        f"<tr><td>{e(check['name'])} {e(check['condition'])}</td>"
                        f"<td>{e(str(check['expected']))}</td><td>{e(str(check['actual']))}</td>"
                        f'<td>{mark}</td><td class="advice">{advice}</td></tr>'
                    )
                out.append("</table>")
            data = timelines.get((scenario["name"], client))
            for request in (data or {}).get("requests", []):
                colour = VERDICT_COLOURS.get(request["verdict"], BAD)
                error = f" — {e(str(request['error']))}" if request.get("error") else ""
                out.append(
                    f'<p>request {request["index"]}: <b style="color:{colour}">'
                    f"{e(request['verdict'])}</b>{error}</p>"
                )
                out.append(timeline_row(request))
            scalar = {k: v for k, v in result["metrics"].items() if not isinstance(v, list | dict)}
            out.append(
                "<details><summary>metrics</summary><table>"
                + "".join(
                    f"<tr><td>{e(k)}</td><td>{e(_fmt(v))}</td></tr>" for k, v in scalar.items()
                )
                + "</table></details></div>"
            )
    out.append("</body></html>")
    return "\n".join(out)


def seed_line(document: dict[str, Any]) -> str:
    """The seed the run used. `run.seed` is `--seed`, None when it was not given: then each
    scenario ran with its own `seed:` (the scorecard's seed column), which the header says
    instead of "seed None"."""
    given = (document.get("run") or {}).get("seed")
    if given is not None:
        return f"seed {given} (--seed, every scenario)"
    seeds = sorted({int(s["seed"]) for s in document["scenarios"] if s.get("seed") is not None})
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return "seeds: each scenario's own (seed column)" if seeds else "seed: none recorded"


def timeline_row(request: dict[str, Any]) -> str:
    """One request's SVG timeline with its key numbers and numbered fault key beside it."""
    e = html.escape
    unit = time_unit(request)
    numbers = "".join(f"<li>{e(line)}</li>" for line in key_numbers(request))
    marks = svg_fault_marks(request)
    faults = "".join(f"<li>{e(mark.key(unit))}</li>" for mark in marks)
    key = f'<ol class="faults">{faults}</ol>' if faults else ""
    return (
        f'<div class="timeline-row">{svg(request)}<div class="numbers"><ul>{numbers}</ul>'
        f"{key}</div></div>"
    )


def symptom_rows(document: dict[str, Any]) -> list[str]:
    """The symptom table: per scenario and client the numbers that name the symptom and
    the diagnosis, as in the terminal scorecard."""
    e = html.escape
    keys = list(figures(symptoms({})))
    out = [
        '<h2>Symptoms</h2><table id="symptoms"><tr><th>scenario / client</th>'
        + "".join(f"<th>{e(key)}</th>" for key in keys)
        + "<th>diagnosis</th></tr>"
    ]
    for index, scenario in enumerate(document["scenarios"]):
        for result in scenario["results"]:
            numbers = figures(symptoms(result))
            out.append(
                f'<tr><td><a href="#s{index}">{e(scenario["name"])}</a> / {e(result["client"])}'
                "</td>"
                + "".join(f"<td>{e(numbers[key])}</td>" for key in keys)
                + f"<td>{e(diagnose(result))}</td></tr>"
            )
    out.append(f'</table><p class="small">{e(FIGURE_LEGEND)}</p>')
    return out


def _fmt(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def write_html(document: dict[str, Any], report_dir: Path) -> Path:
    """Timelines (JSON + PNG) for every run, then `report.html`; returns its path."""
    timelines = write_timelines(document, report_dir)
    path = report_dir / "report.html"
    path.write_text(render(document, timelines), encoding="utf-8")
    return path
