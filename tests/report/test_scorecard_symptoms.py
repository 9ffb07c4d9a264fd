"""The metrics-first scorecard: the numbers that name a symptom beside each verdict, a
one-line diagnosis, and for every failed check why it failed and what to do, the same in
the terminal, junit.xml and report.html.

The two acceptance runs are real (emulator, proxy, the raw client): nginx-default-buffering
must read as a buffering hop from the terminal scorecard alone, and a failed check must
carry a why and a fix into junit.xml. The rest are pure, on plain report documents."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from middlebox.library import scenario_dir
from middlebox.report.diagnosis import (
    description_fix,
    diagnose,
    failure_message,
    figures,
    symptoms,
    why_and_fix,
)
from middlebox.report.html_page import render
from middlebox.report.scorecard import junit_xml, scorecard
from middlebox.run.suite import run_suite

ROOT = Path(__file__).resolve().parents[2]

SILENT = """\
name: trusts-a-clean-close
description: |
  A hop closes the stream cleanly after 12 tokens, with no finish_reason and no [DONE].
seed: 3
upstream: {itl: 15ms, prefill_overhead: 50ms}
workload: {requests: 1, max_tokens: 40, timeout: 15s}
path:
  - cut: {after: tokens, count: 12, end: fin, match: {first: 1}}
expect:
  client.silent_truncations:
    equals: 0
    hint: check finish_reason or data [DONE] before calling a stream complete
"""


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("symptoms")
    (root / "trusts-a-clean-close.yaml").write_text(SILENT)
    report = root / "report"
    suite = run_suite(
        [
            str(scenario_dir() / "nginx-default-buffering.yaml"),
            str(root / "trusts-a-clean-close.yaml"),
        ],
        client_names=["raw"],
        report_dir=report,
        jobs=1,
    )
    return scorecard(suite.document()), report


def row_of(text: str, prefix: str) -> str:
    """The line that starts with `prefix`, joined with the lines that continue it."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(prefix))
    more = [line.strip() for line in itertools.takewhile(continued, lines[start + 1 :])]
    return " ".join([lines[start], *more])


def continued(line: str) -> bool:
    return line.startswith("    ") and bool(line.strip())


def symptom_row(text: str, scenario: str, client: str) -> str:
    """A client's row of the symptom table, under its scenario's line."""
    table = text[text.index("Symptoms:") :]
    group = table[table.index(f"\n{scenario}\n") + 1 :]
    return row_of(group, f"  {client} ")


@pytest.mark.e2e
def test_nginx_default_buffering_reads_as_a_buffering_hop_in_the_terminal_scorecard(
    real_run: tuple[str, Path],
) -> None:
    text, _ = real_run
    header = row_of(text, "scenario / client")
    assert [name for name in re.split(r"\s{2,}", header) if name in figures(symptoms({}))] == [
        "ttft ms",
        "tok/burst",
        "gap ms",
        "attempts",
        "wasted",
        "abort ms",
    ]
    row = symptom_row(text, "nginx-default-buffering", "raw")
    # perceived / upstream TTFT: the user waits for a 4 KiB buffer to fill, the model does not
    _, verdict, ttft, per_burst, *_ = re.split(r"\s{2,}", row.strip())
    assert verdict == "ok 2/2"
    perceived, upstream = map(int, ttft.split("/"))
    assert perceived > 2 * upstream
    # tokens per burst the client saw / the upstream's own: one token per flush at 15 ms (on a
    # loaded machine the emulator's writes now and then merge two tokens: 1.1 seen at load 4)
    seen, made = map(float, per_burst.split("/"))
    assert seen >= 4 * made and made == pytest.approx(1.0, abs=0.25)
    assert "lumps: a buffering hop (proxy_buffering)" in row
    # the why and the fix are said once, under the table
    key = row_of(text, "a buffering hop: ")
    assert "X-Accel-Buffering: no" in key and "proxy_buffering off" in key


@pytest.mark.e2e
def test_a_failed_check_says_why_and_what_to_do_in_the_scorecard_and_junit(
    real_run: tuple[str, Path],
) -> None:
    text, report = real_run
    line = row_of(text, "  trusts-a-clean-close/raw: client.silent_truncations equals 0: got 1")
    assert "why: the stream ended without finish_reason or [DONE]" in line
    assert "fix: check finish_reason or data [DONE] before calling a stream complete" in line
    root = ElementTree.fromstring((report / "junit.xml").read_bytes())
    (failure,) = [
        f for f in root.iter("failure") if "silent_truncations" in (f.get("message") or "")
    ]
    assert "why: the stream ended without finish_reason" in str(failure.get("message"))
    assert "fix: check finish_reason or data [DONE]" in str(failure.get("message"))
    assert str(failure.text).startswith("diagnosis: silent truncation")
    page = (report / "report.html").read_text()
    assert 'id="symptoms"' in page and "<b>why:</b>" in page and "a buffering hop" in page


# ----------------------------------------------------------------- pure, on documents


def result(**metrics: Any) -> dict[str, Any]:
    verdicts = metrics.pop("verdicts", ["complete"])
    attempts = metrics.pop("attempts", 1)
    fired = metrics.pop("fired", [])
    return {
        "client": "raw",
        "passed": True,
        "requests": [{"verdict": v, "attempts": attempts} for v in verdicts],
        "verdicts": {"requests": verdicts, "faults_fired": fired, "checks": {}},
        "metrics": {"client.bursts": 10, **metrics},
        "checks": [],
        "faults_declared": [],
    }


def test_the_figures_are_perceived_against_upstream_ttft_and_the_lumpiness() -> None:
    found = figures(
        symptoms(
            result(**{
                "client.perceived_ttft_ms": [390.4, 267.0, 300.0],
                "server.upstream_ttft_ms": [67.0, 61.2],
                "client.tokens_per_burst": 15.0,
                "server.tokens_per_burst": 1.02,
                "client.largest_gap_ms": 240.2,
                "server.tokens_wasted": 7,
                "server.abort_latency_ms": [1.0, 12.6],
            })
        )
    )  # fmt: skip
    assert found == {
        "ttft ms": "300/64",
        "tok/burst": "15.0/1.0",
        "gap ms": "240",
        "attempts": "1/1",
        "wasted": "7",
        "abort ms": "13",
    }
    assert figures(symptoms({}))["ttft ms"] == "-/-"  # nothing measured reads as nothing


def test_the_diagnosis_names_the_worst_symptom_first() -> None:
    assert diagnose(result(verdicts=["silent_truncation"])).startswith("silent truncation: ")
    assert diagnose(result(verdicts=["hang", "mojibake"])).startswith("hung: ")
    lumpy = diagnose(
        result(**{"client.tokens_per_burst": 15.0}, fired=["proxy_buffering:released"])
    )
    assert lumpy.startswith(
        "arrived in ~15-token (~4 KiB) lumps: a buffering hop (proxy_buffering)"
    )
    assert diagnose(result(**{"client.tokens_per_burst": 1.0})) == "healthy: complete"
    # without a buffering fault a loaded machine merges flushes: 5 is not yet lumpy, 9 is
    assert diagnose(result(**{"client.tokens_per_burst": 5.0})) == "healthy: complete"
    assert "a buffering hop;" in diagnose(result(**{"client.tokens_per_burst": 9.0}))
    slow = {"client.perceived_ttft_ms": [500.0], "server.upstream_ttft_ms": [60.0]}
    late = result(**slow, fired=["latency:delaying"])
    assert "440 ms after the upstream's first token: a slow hop (latency)" in diagnose(late)
    # no delaying fault: the gap is the client's start and the machine, not a hop
    assert diagnose(result(**slow)) == "healthy: complete"
    # a retried request's TTFT counts from its first attempt: not a late head
    retried = result(**slow, attempts=2, fired=["latency:delaying"])
    assert "after the upstream's first token" not in diagnose(retried)
    wasted = diagnose(result(verdicts=["abandoned"], **{"server.tokens_wasted": 40}))
    assert (
        wasted.startswith("40 tokens generated for nobody")
        and "proxy_ignore_client_abort" in wasted
    )
    assert "nobody" not in diagnose(result(verdicts=["abandoned"], **{"server.tokens_wasted": 2}))
    assert diagnose(result(**{"client.amplification": 3})).startswith(
        "3 attempts for one request (each may re-run the model)"
    )
    # retries a hop answered with 429 ran the model no times: the line says so
    answered = result(**{"client.amplification": 3, "server.generations_per_request": 0})
    assert diagnose(answered).startswith("3 attempts for one request (the model ran 0)")


CHECK = {"name": "client.silent_truncations", "condition": "equals", "expected": 0, "actual": 1}


def test_the_fix_is_the_hint_then_the_description_then_the_usual_one() -> None:
    described = {"description": "A hop cuts the stream. The fix is a client that checks\n  [DONE]."}
    hinted = {
        **described,
        "hints": {
            "client.silent_truncations": "hint for all",
            "raw/client.silent_truncations": "raw's own",
        },
    }
    assert why_and_fix(hinted, "raw", CHECK)[1] == "raw's own"
    assert why_and_fix(hinted, "openai", CHECK)[1] == "hint for all"
    assert why_and_fix(described, "raw", CHECK)[1] == "The fix is a client that checks [DONE]."
    why, fix = why_and_fix({}, "raw", CHECK)
    assert "without finish_reason or [DONE]" in why and fix.startswith("treat a stream")
    assert description_fix("Nothing to see here.") is None
    assert failure_message({}, "raw", CHECK).startswith(
        "client.silent_truncations equals 0: got 1; why: "
    )


def document() -> dict[str, Any]:
    failed = result(verdicts=["silent_truncation"])
    failed["passed"] = False
    failed["checks"] = [{**CHECK, "passed": False}]
    return {
        "passed": False,
        "run": {"seed": 1},
        "clients": ["raw"],
        "scenarios": [
            {
                "name": "s",
                "file": "s.yaml",
                "seed": 1,
                "description": "d",
                "hints": {"client.silent_truncations": "check [DONE]"},
                "problems": [],
                "proof": {},
                "results": [failed],
            },
            {
                "name": "offline",
                "seed": 1,
                "status": "needs the emulator: a cassette",
                "problems": [],
                "results": [],
            },
        ],
    }


def test_junit_and_html_carry_the_same_why_and_fix_as_the_terminal() -> None:
    doc = json.loads(json.dumps(document()))
    text = scorecard(doc)
    assert "s/raw: client.silent_truncations equals 0: got 1; why: " in text
    (failure,) = ElementTree.fromstring(junit_xml(doc)).iter("failure")
    assert failure.get("message") == failure_message(
        doc["scenarios"][0], "raw", doc["scenarios"][0]["results"][0]["checks"][0]
    )
    assert "fix: check [DONE]" in str(failure.get("message"))
    page = render(doc, {})
    assert "<b>fix:</b> check [DONE]" in page and "diagnosis: silent truncation" in page


def test_a_scenario_that_could_not_run_shows_its_status_in_the_symptom_table() -> None:
    rows = [line for line in scorecard(document()).splitlines() if line.startswith("offline")]
    assert len(rows) == 2  # the matrix and the symptom table
    assert all("needs the emulator: a cassette" in row for row in rows)


def load_text(text: str) -> Any:
    from middlebox.compose import REGISTRY, scenario_sections
    from middlebox.scenario.load import load_scenario_text

    return load_scenario_text(text, REGISTRY, sections=scenario_sections())


def test_a_hint_beside_an_expectation_is_kept_for_the_views_and_not_checked() -> None:
    scenario = load_text(
        "name: h\npath: []\nexpect:\n"
        "  client.silent_truncations: {equals: 0, hint: 'check\n    [DONE]'}\n"
        "  raw: {client.silent_truncations: {equals: 1, hint: raw trusts the close}}\n"
    )
    assert scenario.sections["expect"] == {
        "client.silent_truncations": {"equals": 0},
        "raw": {"client.silent_truncations": {"equals": 1}},
    }
    assert scenario.sections["expect_hints"] == {
        "client.silent_truncations": "check [DONE]",
        "raw/client.silent_truncations": "raw trusts the close",
    }


def test_a_hint_alone_or_not_text_is_a_scenario_error() -> None:
    from middlebox.scenario.convert import ScenarioError

    with pytest.raises(ScenarioError, match="a hint needs a condition beside it"):
        load_text("name: h\npath: []\nexpect:\n  client.complete: {hint: why}\n")
    with pytest.raises(ScenarioError, match="hint must be a non-empty string"):
        load_text("name: h\npath: []\nexpect:\n  client.complete: {equals: 1, hint: [1]}\n")
