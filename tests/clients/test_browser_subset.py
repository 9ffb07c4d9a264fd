"""The compatibility matrix's CI subset for the two Chromium clients, end to end.

The same five scenarios as test_matrix_subset.py (Python clients) and test_node_clients.py
(Node clients), for `browser` (fetch() streaming) and `browser-eventsource` (an
EventSource following a resumable server's stream), through the proxy and the emulator,
held to the scenarios' `expect:` pins. Then what the table publishes for them: the fetch
reader raises on an RST, ends silently without `[DONE]` and waits on a stall; a browser's
EventSource only GETs, so on these servers (none resumable) the page can only error.

Skips without Chromium on a developer's machine, never under CI=true (`needs`). The run's
report stays under pytest's tmp dir, and a failure message says what each failing client's
proxy saw (tests/clients/suite_evidence.py): these runs have failed intermittently in CI
("the cut never fired", "the second 429 did not come") and never here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from middlebox.clients import chromium_path
from middlebox.library import scenario_dir
from tests.clients.suite_evidence import failure_evidence
from tests.clients.test_matrix_subset import SUBSET
from tests.harness import needs

pytestmark = [pytest.mark.e2e]
with_chromium = needs(chromium_path(), "Chromium")

REPO = Path(__file__).resolve().parents[2]
BROWSERS = ["browser", "browser-eventsource"]


@pytest.fixture(scope="module")
def subset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """(scenario, client) -> result entry, every failed expectation or problem, and the
    report directory the run wrote (journals, client stderr)."""
    # with_chromium skips these tests before this runs, except under CI=true: there it fails.
    assert chromium_path(), "Chromium is needed (.ci/run installs it)"
    from middlebox.run.suite import run_suite  # the run room: only this part needs it

    files = [str(scenario_dir() / f"{name}.yaml") for name in SUBSET]
    report = tmp_path_factory.mktemp("browser-subset")
    document = run_suite(files, client_names=BROWSERS, jobs=1, report_dir=report).document()
    results: dict[tuple[str, str], dict[str, Any]] = {}
    failures: list[str] = []
    for scenario in document["scenarios"]:
        # The EventSource page drops its POST after the head, so a fault that cuts that
        # stream later never fires for it, and the run says so: expected here.
        ignored = f"{scenario['name']}/browser-eventsource: declared fault"
        failures += [p for p in scenario["problems"] if not p.startswith(ignored)]
        for result in scenario["results"]:
            results[(scenario["name"], result["client"])] = result
            failures += [
                f"{scenario['name']}/{result['client']}: {c['name']} {c['condition']} "
                f"{c['expected']}: got {c['actual']}"
                for c in result["checks"]
                if not c["passed"]
            ]
    return {"results": results, "failures": failures, "report": report}


def evidence(subset: dict[str, Any], *failures: str) -> str:
    """What the named clients' proxies saw, for an assertion's message."""
    return failure_evidence(subset["report"], list(failures), BROWSERS)


def verdicts(subset: dict[str, Any], scenario: str, client: str) -> list[str]:
    return [request["verdict"] for request in subset["results"][(scenario, client)]["requests"]]


@with_chromium
def test_both_browser_clients_ran_the_subset_and_meet_their_pins(subset: dict[str, Any]) -> None:
    assert sorted(subset["results"]) == sorted((s, c) for s in SUBSET for c in BROWSERS)
    failures = subset["failures"]
    assert failures == [], "\n".join([*failures, evidence(subset, *failures)])


@with_chromium
def test_the_fetch_reader_raises_on_a_reset_is_silent_without_done_and_waits_on_a_stall(
    subset: dict[str, Any],
) -> None:
    expected = {
        "reset-mid-stream": ["truncation_detected"],
        "clean-close-without-done": ["silent_truncation"],
        "client-vanishes": ["hang"],
        "utf8-sliced-stream": ["complete"],  # TextDecoderStream
        "rate-limit-storm": ["error_reported"] * 2,
    }
    shown = {scenario: verdicts(subset, scenario, "browser") for scenario in expected}
    wrong = [
        f"{scenario}/browser: {shown[scenario]}"
        for scenario in expected
        if shown[scenario] != expected[scenario]
    ]
    assert shown == expected, evidence(subset, *wrong)


@with_chromium
def test_the_browser_eventsource_errors_where_no_resumable_stream_is_offered(
    subset: dict[str, Any],
) -> None:
    for scenario in SUBSET:
        entry = subset["results"][(scenario, "browser-eventsource")]
        assert {r["verdict"] for r in entry["requests"]} == {"error_reported"}, scenario
        # 429s answer the POST itself; every other server answers it without X-Stream-Id
        if scenario != "rate-limit-storm":
            assert all("no X-Stream-Id" in (r["error"] or "") for r in entry["requests"])
