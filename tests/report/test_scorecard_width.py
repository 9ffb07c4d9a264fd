"""The terminal scorecard reads in a CI log: every line fits in WIDTH (160) columns and
nothing is lost to fit it; each diagnosis's why and fix is said once, under the table; a
PASS beside red cells says that they are the client libraries' known behaviours, pinned
by `expect:`; report.json lists every client the table has a column for."""

from __future__ import annotations

from typing import Any

from middlebox.report.scorecard import WIDTH, matrix, pinned_cells, scorecard, symptom_table
from middlebox.run.outcome import ScenarioOutcome, SuiteOutcome
from middlebox.run.score import Check, ClientScore, RequestScore
from middlebox.scenario.model import Scenario

CLIENTS = ["raw", "openai", "httpx-sse", "resilient", "node-fetch-event-source", "tools-naive"]
LONG_HINT = "check finish_reason or data: [DONE] before calling a stream complete " * 4


def result(client: str, verdict: str, passed: bool = True, **metrics: Any) -> dict[str, Any]:
    checks = [{"name": "client.silent_truncations", "condition": "equals", "expected": 1,
               "actual": 1 if verdict == "silent_truncation" else 0, "passed": passed}]  # fmt: skip
    return {
        "client": client,
        "passed": passed,
        "requests": [{"verdict": verdict, "attempts": 3}],
        "verdicts": {"requests": [verdict], "faults_fired": ["proxy_buffering:released"]},
        "metrics": {
            "client.bursts": 4,
            "client.tokens_per_burst": 15.0,
            "server.tokens_per_burst": 1.0,
            "client.amplification": 3,
            "server.tokens_wasted": 280,
            "client.perceived_ttft_ms": [12805.0],
            "server.upstream_ttft_ms": [61.0],
            **metrics,
        },
        "checks": checks,
        "faults_declared": ["proxy_buffering", "never_fires"],
        "takes": [
            {
                "take": n,
                "kept": n == 2,
                "held": n == 2,
                "why_not": LONG_HINT,
                "server_stall_ms": 900,
                "loop_lag_ms": 12,
                "gc_pause_ms": 3,
            }
            for n in (1, 2)
        ],
    }


def library_document() -> dict[str, Any]:
    """50 scenarios with long names, six clients, two-symptom diagnoses, failed checks with
    long hints, problems, re-takes and a scenario that could not run."""
    scenarios = []
    for n in range(50):
        verdict = ["silent_truncation", "hang", "complete", "abandoned"][n % 4]
        scenarios.append(
            {
                "name": f"abandon-through-a-proxy-that-ignores-the-close-{n:02d}",
                "description": "A hop holds the stream.",
                "hints": {"client.silent_truncations": LONG_HINT},
                "problems": [f"problem {n}: " + LONG_HINT] if n % 10 == 0 else [],
                "quiet_faults": [],
                "results": [result(c, verdict, passed=n % 7 != 0) for c in CLIENTS],
            }
        )
    scenarios.append(
        {
            "name": "vllm-engine-error",
            "status": "needs the emulator: " + LONG_HINT,
            "needs_emulator": LONG_HINT,
            "problems": [],
            "results": [],
        }
    )
    return {"passed": False, "clients": CLIENTS[:4], "scenarios": scenarios}


def joined(text: str) -> str:
    """The scorecard with each wrapped line joined back to the line it continues."""
    out: list[str] = []
    for line in text.splitlines():
        if out and line.startswith("    ") and line.strip() and not line.startswith("  " * 3):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out)


def test_every_line_of_a_library_sized_scorecard_fits_in_160_columns() -> None:
    text = scorecard(library_document())
    widest = max(text.splitlines(), key=len)
    assert len(widest) <= WIDTH, widest
    assert WIDTH == 160


def test_fitting_the_width_loses_no_failed_check_problem_take_or_status() -> None:
    text = joined(scorecard(library_document()))
    for n in range(0, 50, 7):
        name = f"abandon-through-a-proxy-that-ignores-the-close-{n:02d}"
        assert f"  {name}/node-fetch-event-source: client.silent_truncations equals 1" in text
    assert text.count(f"fix: {LONG_HINT.strip()}") == 6 * len(range(0, 50, 7))
    assert text.count(f": {LONG_HINT.strip()}") >= 5  # problems, takes, the status
    assert "warning: declared fault(s) never fired: never_fires" in text
    assert "take 2 (kept) held, server stall 900 ms" in text


def test_the_matrix_splits_its_columns_into_blocks_that_fit() -> None:
    document = library_document()
    lines = matrix(document, CLIENTS, colour=False)
    assert max(map(len, lines)) <= WIDTH
    headers = [line.split() for line in lines if line.startswith("scenario")]
    assert len(headers) == 2
    assert [c for header in headers for c in header[1:]] == CLIENTS  # every column, once
    # a wide matrix fits when asked for a wider terminal, in one block
    assert (
        sum(
            line.startswith("scenario")
            for line in matrix(document, CLIENTS, colour=False, width=400)
        )
        == 1
    )


def test_a_block_lists_only_the_scenarios_that_ran_one_of_its_clients() -> None:
    agent = {"client": "tools-naive", "passed": True, "requests": [{"verdict": "complete"}],
             "metrics": {}, "checks": []}  # fmt: skip
    plain = {**agent, "client": "raw"}
    document = {
        "clients": ["raw", "tools-naive"],
        "scenarios": [
            {"name": "tool-call", "results": [agent]},
            {"name": "healthy", "results": [plain]},
        ],
    }
    first, _, second = "\n".join(
        matrix(document, ["raw", "tools-naive"], colour=False, width=20)
    ).partition("\n\n")
    assert "healthy" in first and "tool-call" not in first
    assert "tool-call" in second and "healthy" not in second


def test_the_symptom_table_names_diagnoses_and_the_key_says_why_and_fix_once() -> None:
    document = library_document()
    table = symptom_table(document)
    assert max(map(len, table)) <= WIDTH
    rows = [line for line in table if line.startswith("  node-fetch-event-source ")]
    assert len(rows) == 50  # one row per run, under its scenario's line
    assert "silent truncation; 3 attempts for one request" in rows[0]
    text = joined(scorecard(document))
    # each diagnosis's why and fix once, whatever number of runs it names
    assert text.count("treat a stream that ends without finish_reason") == 1
    assert text.count("resume instead of restarting") == 1
    assert text.count("give the client a read timeout") == 1
    key = text[text.index("Diagnoses (why, and the usual fix):") :]
    assert key.index("silent truncation: ") < key.index("attempts for one request: ")


def test_a_pass_beside_red_cells_says_they_are_known_behaviours_pinned_by_expect() -> None:
    pinned = result("raw", "silent_truncation")
    unpinned = {**result("openai", "hang"), "checks": []}
    failed = result("httpx-sse", "silent_truncation", passed=False)
    fine = result("resilient", "complete")
    document = {
        "passed": True,
        "clients": ["raw", "openai", "httpx-sse", "resilient"],
        "scenarios": [{"name": "s", "problems": [], "results": [pinned, unpinned, failed, fine]}],
    }
    counts, unchecked = pinned_cells(document)
    assert dict(counts) == {"SILENT": 1} and unchecked == 1
    tail = joined(scorecard(document)).splitlines()[-3:]
    assert tail[0] == "3/4 scenario-client runs met their expectations; PASS"
    assert tail[1].startswith(
        "  of them, 1 red cells (SILENT 1) are known behaviours of those client"
    )
    assert "pinned by its scenario's expect: and met as expected" in tail[1]
    assert "1 red cells of runs that met their expectations show a verdict no expect:" in tail[2]
    # no red cell among the runs that passed: no such line
    calm = {**document, "scenarios": [{"name": "s", "problems": [], "results": [fine]}]}
    assert scorecard(calm).endswith("1/1 scenario-client runs met their expectations; PASS")


def test_report_json_lists_every_client_the_table_has_a_column_for() -> None:
    def scored(client: str) -> ClientScore:
        return ClientScore("s", client, requests=[RequestScore(0, "complete", 3, 3, 1, 1)],
                           checks=[Check("client.complete", "equals", 1, 1, True)])  # fmt: skip

    plain = ScenarioOutcome(Scenario(name="plain", source="p.yaml"), 1, [scored("raw")])
    agent = ScenarioOutcome(
        Scenario(name="agent", source="a.yaml"), 1, [scored("resilient"), scored("tools-naive")]
    )
    document = SuiteOutcome([plain, agent], 1, ["raw", "resilient"]).document()
    assert document["clients"] == ["raw", "resilient", "tools-naive"]
    header = next(line for line in scorecard(document).splitlines() if line.startswith("scenario"))
    assert header.split()[1:] == document["clients"]
