"""The compatibility matrix's CI subset: five scenarios for every Python client, end to end.

`make matrix` runs the whole scenario library against every client and takes tens of
minutes; CI runs the five scenarios that separate the libraries (an RST mid-stream, a
clean close without `[DONE]`, UTF-8 split across reads, a 429 storm, a client whose
network vanishes) through the proxy and the emulator, for each Python client, and holds
each one to the `expect:` pins of the scenarios (so a library release that changes
behaviour fails here), then checks the ground truth the matrix exists to publish: the
naive per-read decoder shows mojibake and nothing else does, openai raises on an RST but
ends silently without `[DONE]` and waits 600 s on a stall where httpx-sse times out at
5 s, and the openai 1.x/2.x lines let httpx's exceptions escape where 3.x wraps them.

The clients whose libraries live in their own environments (openai-v1, openai-v2,
langchain-openai, litellm, anthropic-messages) build them on first use
(middlebox.clients.envs); each client runs the five scenarios on its own, so a dozen
interpreters never import side by side inside the scenarios' bounds. The Node clients run
the same five in tests/clients/test_node_clients.py (checked below to stay so). Each
group's report stays under pytest's tmp dir, and a failure message says what each failing
client's proxy saw (tests/clients/suite_evidence.py): client-vanishes/httpx-sse has failed
intermittently in CI (the vanish never fired, so httpx-sse read the whole answer) and never
here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from middlebox.clients import BUILTIN_CLIENTS, envs
from middlebox.library import scenario_dir
from tests.clients.suite_evidence import failure_evidence

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
LIBRARY = scenario_dir()
SUBSET = [
    "reset-mid-stream",
    "clean-close-without-done",
    "utf8-sliced-stream",
    "rate-limit-storm",
    "client-vanishes",
]
# light clients (aiohttp, httpx, the .venv's openai) share a run three at a time; each
# locked one runs alone
LIGHT = [
    "raw",
    "openai",
    "httpx-sse",
    "resilient",
    "aiohttp-lines",
    "aiohttp-naive",
    "openai-responses",
]
LOCKED = list(envs.LOCKED_CLIENTS)
PYTHON_CLIENTS = LIGHT + LOCKED


@pytest.fixture(scope="module")
def subset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every Python client over the five scenarios: (scenario, client) -> result entry,
    every failure, and each client's report directory (journals, client stderr)."""
    from middlebox.run.suite import run_suite  # the run room: only this part needs it

    files = [str(LIBRARY / f"{name}.yaml") for name in SUBSET]
    results: dict[tuple[str, str], dict[str, Any]] = {}
    failures: list[str] = []
    reports: dict[str, Path] = {}
    for group in [LIGHT[:3], LIGHT[3:], *([name] for name in LOCKED)]:
        for name in group:
            BUILTIN_CLIENTS[name]  # build a locked environment now, outside every bound
        # a locked client runs one scenario at a time: litellm alone takes 11-15 s to
        # import on a loaded 2-core machine, inside its scenario's 20 s bound
        jobs = 1 if group[0] in LOCKED else 2
        report = tmp_path_factory.mktemp(f"matrix-subset-{group[0]}")
        reports.update(dict.fromkeys(group, report))
        document = run_suite(files, client_names=group, jobs=jobs, report_dir=report).document()
        for scenario in document["scenarios"]:
            failures += scenario["problems"]
            for result in scenario["results"]:
                results[(scenario["name"], result["client"])] = result
                if not result["passed"]:
                    failed = [
                        f"{c['name']} {c['condition']} {c['expected']}: got {c['actual']}"
                        for c in result["checks"]
                        if not c["passed"]
                    ]
                    failures.append(f"{scenario['name']}/{result['client']}: {failed}")
    yield {"results": results, "failures": failures, "reports": reports}


def evidence(subset: dict[str, Any], *failures: str) -> str:
    """What the proxies of the clients the failures name saw, for an assertion's message
    (a scenario-wide problem: every client of each group that ran it)."""
    groups: dict[Path, list[str]] = {}
    for client, report in subset["reports"].items():
        groups.setdefault(report, []).append(client)
    found = (
        failure_evidence(report, list(failures), clients) for report, clients in groups.items()
    )
    return "\n".join(part for part in found if part)


def verdicts(subset: dict[str, Any], scenario: str, client: str) -> list[str]:
    return [request["verdict"] for request in subset["results"][(scenario, client)]["requests"]]


def errors(subset: dict[str, Any], scenario: str, client: str) -> list[str]:
    return [r["error"] or "" for r in subset["results"][(scenario, client)]["requests"]]


def test_every_python_client_ran_every_scenario_of_the_subset(subset: dict[str, Any]) -> None:
    missing = [
        f"{scenario}/{client}"
        for scenario in SUBSET
        for client in PYTHON_CLIENTS
        if (scenario, client) not in subset["results"]
    ]
    assert missing == []


def test_every_client_meets_the_expectations_pinned_in_the_scenarios(
    subset: dict[str, Any],
) -> None:
    failures = subset["failures"]
    assert failures == [], "\n".join([*failures, evidence(subset, *failures)])


def test_only_the_per_read_decoder_shows_mojibake_on_split_utf8(subset: dict[str, Any]) -> None:
    shown = {client: verdicts(subset, "utf8-sliced-stream", client) for client in PYTHON_CLIENTS}
    assert shown.pop("aiohttp-naive") == ["mojibake"]
    assert {client: v for client, v in shown.items() if v != ["complete"]} == {}


def test_openai_3x_raises_on_a_reset_but_is_silent_on_a_clean_end_without_done(
    subset: dict[str, Any],
) -> None:
    assert verdicts(subset, "reset-mid-stream", "openai") == ["truncation_detected"]
    assert errors(subset, "reset-mid-stream", "openai")[0].startswith("APIConnectionError")
    assert verdicts(subset, "clean-close-without-done", "openai") == ["silent_truncation"]


def test_a_stall_hangs_openai_600s_read_timeout_where_httpx_sse_times_out_at_5s(
    subset: dict[str, Any],
) -> None:
    seen = evidence(subset, "client-vanishes/openai:", "client-vanishes/httpx-sse:")
    assert verdicts(subset, "client-vanishes", "openai") == ["hang"], seen
    assert verdicts(subset, "client-vanishes", "httpx-sse") == ["truncation_detected"], seen
    assert "ReadTimeout" in errors(subset, "client-vanishes", "httpx-sse")[0], seen


def test_openai_1x_and_2x_let_httpx_exceptions_escape_where_3x_wraps_them(
    subset: dict[str, Any],
) -> None:
    for line in ("openai-v1", "openai-v2"):
        assert verdicts(subset, "reset-mid-stream", line) == ["truncation_detected"]
        raised = errors(subset, "reset-mid-stream", line)[0].split(":")[0]
        assert raised in {"RemoteProtocolError", "ReadError"}, (line, raised)


def test_the_responses_and_messages_loops_raise_on_a_reset_and_are_silent_on_a_clean_end(
    subset: dict[str, Any],
) -> None:
    """Neither SDK checks that its stream reached `response.completed` / `message_stop`;
    on a reset openai wraps httpx's error, anthropic lets it escape."""
    raised = {"openai-responses": "APIConnectionError", "anthropic-messages": "ReadError"}
    for client in ("openai-responses", "anthropic-messages"):
        assert verdicts(subset, "reset-mid-stream", client) == ["truncation_detected"]
        assert errors(subset, "reset-mid-stream", client)[0].startswith(raised[client])
        assert verdicts(subset, "clean-close-without-done", client) == ["silent_truncation"]
        assert verdicts(subset, "client-vanishes", client) == ["hang"]


def test_the_node_clients_run_the_same_subset_in_their_own_test() -> None:
    """The Node clients' subset lives in test_node_clients.py (one run of them, not two);
    read from its source so the two lists cannot drift apart."""
    source = (REPO / "tests" / "clients" / "test_node_clients.py").read_text()
    assigned = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "CI_SUBSET" for t in node.targets)
    ]
    assert len(assigned) == 1
    assert set(SUBSET) <= set(ast.literal_eval(assigned[0]))
