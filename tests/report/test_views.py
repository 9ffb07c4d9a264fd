"""Pictures of a run: timeline data from the ledger, the client's result and the journal;
the PNG, the inline SVG, the offline report.html, and the progress line."""

from __future__ import annotations

import io
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from middlebox.clients.browser import without_priority_raise
from middlebox.observe.journal import JournalView
from middlebox.report.html_page import render
from middlebox.report.progress import Progress
from middlebox.report.scorecard import WIDTH
from middlebox.report.timeline import svg, timeline_data, write_png
from tests.harness import needs

TAG = "[middlebox s/c/0]"
LEDGER = [
    {
        "prompt": [{"role": "user", "content": f"{TAG} hello"}],
        "received_at": 100.0,
        "token_times": [100.2, 100.23, 100.26, 100.29],
        "finished_at": 100.3,
    }
]
# a buffering hop: nothing for 0.1 s, then three pieces at once, then the last one
RESULT = {
    "results": [
        {
            "index": 0,
            "started_at": 99.9,
            "ended_at": 100.6,
            "chunks": [[100.4, "a"], [100.401, "b"], [100.402, "c"], [100.5, "d"]],
            "error": None,
        }
    ]
}
JOURNAL = [
    JournalView(1, faults=[{"time": 100.35, "fault": "proxy_buffering", "action": "flushed"}])
]


def data() -> dict[str, Any]:
    return timeline_data("s", "c", [TAG], LEDGER, RESULT, JOURNAL, ["complete"])


def test_timeline_data_puts_tokens_pieces_bursts_gaps_and_faults_on_the_request_clock() -> None:
    request = data()["requests"][0]
    assert request["tokens"] == pytest.approx([0.3, 0.33, 0.36, 0.39])
    assert request["shown"] == pytest.approx([0.5, 0.501, 0.502, 0.6])
    assert [b[2] for b in request["bursts"]] == [3, 1]
    assert request["largest_gap"] == pytest.approx([0.502, 0.6])
    assert request["faults"] == [[pytest.approx(0.45), "proxy_buffering:flushed"]]
    assert request["verdict"] == "complete"


def test_the_svg_is_well_formed_and_shows_both_staircases_and_the_fault() -> None:
    picture = svg(data()["requests"][0])
    root = ElementTree.fromstring(picture)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2
    titles = [t.text for t in root.iter(f"{ns}title")]
    assert "proxy_buffering:flushed" in titles
    assert "burst of 3 pieces" in titles


def test_the_png_is_written(tmp_path: Path) -> None:
    path = write_png(data(), tmp_path / "t.png")
    head = path.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def document() -> dict[str, Any]:
    result = {
        "client": "c",
        "verdicts": {"requests": ["complete"], "checks": {"client.complete": False}},
        "requests": [{"verdict": "complete"}],
        "metrics": {"client.complete": 1, "client.itl_ms": [1.0]},
        "checks": [
            {
                "name": "client.complete",
                "condition": "min",
                "expected": 2,
                "actual": 1,
                "passed": False,
            }
        ],
    }
    return {
        "middlebox": "0",
        "python": "3",
        "run": {"seed": 1},
        "passed": False,
        "scenarios": [
            {
                "name": "s",
                "file": "s.yaml",
                "seed": 1,
                "problems": ["s: declared fault 'x' never fired for any client <b>"],
                "proof": {
                    "connections": {"c": 1},
                    "faults": {
                        "x": {
                            "fired": 0,
                            "bypassed": 1,
                            "clients_fired": [],
                            "clients_bypassed": [],
                        }
                    },
                },
                "results": [result],
            }
        ],
    }


class Structure(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.external: list[str] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        for key in ("href", "src"):
            target = values.get(key)
            if target:
                self.links.append(target)
                if "://" in target:
                    self.external.append(target)

    def handle_data(self, data: str) -> None:
        self.text += data


def test_report_html_is_self_contained_with_scorecard_problems_proof_and_timelines() -> None:
    page = render(document(), {("s", "c"): data()})
    parsed = Structure()
    parsed.feed(page)
    assert {"scorecard", "verdict", "s0"} <= parsed.ids
    assert "script" not in parsed.tags and not parsed.external  # opens offline
    assert parsed.tags.count("svg") == 1
    assert "runs/00-s/c.journal.ndjson" in parsed.links
    assert "runs/00-s/c.timeline.png" in parsed.links
    assert "never fired for any client <b>" in parsed.text  # escaped, shown as text
    assert "FAIL" in parsed.text and "failed" in parsed.text


def test_the_progress_line_is_drawn_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, pipe = Tty(), io.StringIO()
    for stream in (terminal, pipe):
        progress = Progress(2, stream)
        progress.update(started="a")
        progress.update(finished="a", failed=True)
        line = progress.update(started="b")
    assert line.endswith("1/2 scenarios, 1 failed; running b")
    assert terminal.getvalue().count("\r") == 3
    # a pipe (CI logs, `make run | cat`) gets no bar, a plain line per finished scenario
    assert pipe.getvalue() == "[1/2] a: FAIL\n"


def test_off_a_terminal_each_finished_scenario_is_one_line_of_its_clients_verdicts() -> None:
    pipe = io.StringIO()
    progress = Progress(3, pipe)
    lumpy = {
        "client": "raw",
        "passed": True,
        "requests": [{"verdict": "complete", "attempts": 1}] * 2,
        "verdicts": {"requests": ["complete"] * 2, "faults_fired": ["proxy_buffering:released"]},
        "metrics": {
            "client.bursts": 8,
            "client.tokens_per_burst": 15.0,
            "client.perceived_ttft_ms": [390.0, 267.0],
            "server.upstream_ttft_ms": [67.0, 61.0],
            "client.largest_gap_ms": 240.0,
        },
    }
    silent = {
        **lumpy,
        "client": "openai",
        "passed": False,
        "requests": [{"verdict": "silent_truncation", "attempts": 1}],
        "verdicts": {"requests": ["silent_truncation"], "faults_fired": []},
        "metrics": {"client.bursts": 3, "client.tokens_per_burst": 1.0},
    }
    progress.update(started="nginx-default-buffering")
    assert pipe.getvalue() == ""  # a start draws nothing off a terminal
    progress.update(finished="nginx-default-buffering", results=[lumpy, silent])
    # the numbers and the diagnosis are the scorecard's symptom table: said once, there
    assert pipe.getvalue() == "[1/3] nginx-default-buffering: raw ok 2/2, openai SILENT 1/1 ✗\n"


def test_a_finished_scenario_with_many_clients_wraps_within_the_scorecards_width() -> None:
    pipe = io.StringIO()
    progress = Progress(50, pipe)
    results = [
        {
            "client": f"client-with-a-long-name-{n}",
            "passed": True,
            "requests": [{"verdict": "abandoned", "attempts": 1}],
            "metrics": {"server.tokens_wasted": 280},
        }
        for n in range(12)
    ]
    progress.update(finished="abandon-ignore-client-close", results=results)
    lines = pipe.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= WIDTH for line in lines)
    assert lines[0].startswith("[1/50] abandon-ignore-client-close: client-with-a-long-name-0 ")
    assert all(line.startswith("    ") for line in lines[1:])  # continued, indented
    said = " ".join(line.strip() for line in lines)
    assert all(f"client-with-a-long-name-{n} abandoned 1/1 w280" in said for n in range(12))


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@needs(CHROMIUM, "Chromium")
def test_report_html_renders_in_headless_chromium_without_console_errors(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render(document(), {("s", "c"): data()}), encoding="utf-8")
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [
            str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
            "--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
            "--window-size=1200,900", page.as_uri(),
        ],
        capture_output=True, text=True, timeout=60, preexec_fn=without_priority_raise,
    )  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
    dom = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60, preexec_fn=without_priority_raise,
    ).stdout  # fmt: skip
    assert 'id="scorecard"' in dom and "<svg" in dom
