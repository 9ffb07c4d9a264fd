"""`make matrix` (middlebox/run/matrix.py) and its view (middlebox/report/compatibility.py).

The runs themselves are replaced by report documents written here, so these tests say
what the matrix does with verdicts: one cell per scenario and client from the scorecard,
versions from where each library is installed or pinned, the fixes section for silent
truncations, hangs and mojibake, and the committed docs/compatibility.md naming every
client and every scenario of the library.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

import pytest

import middlebox
from middlebox import clients as registry
from middlebox.clients import envs
from middlebox.clients.facts import CLIENT_FACTS, ClientFacts
from middlebox.library import scenario_dir
from middlebox.report.compatibility import SYMPTOMS, compatibility_markdown, fixes_section
from middlebox.run import matrix
from tests.harness import needs

REPO = Path(__file__).resolve().parents[2]


def result(client: str, *verdicts: str, passed: bool = True, wasted: int = 0) -> dict[str, Any]:
    return {
        "client": client,
        "requests": [{"verdict": v} for v in verdicts],
        "metrics": {"server.tokens_wasted": wasted},
        "passed": passed,
    }


def document(*scenarios: tuple[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"scenarios": [{"name": name, "results": results} for name, results in scenarios]}


def two_client_matrix() -> dict[str, Any]:
    rows = [
        {
            "name": "aiohttp-naive", "library": "aiohttp", "version": "3.14.5",
            "runtime": "python", "timeout": "300 s total", "retries": "none", "resume": "none",
            "fixes": {"mojibake": "decode incrementally", "hang": "sock_read=10"},
        },
        {
            "name": "resilient", "library": "", "version": "middlebox 0.1.0",
            "runtime": "python", "timeout": "10 s stall", "retries": "3 | 8", "resume": "yes",
            "fixes": {},
        },
    ]  # fmt: skip
    cells = {
        "aiohttp-naive": {
            "utf8-sliced-stream": {"cell": "MOJIBAKE 1/1", "verdicts": ["mojibake"]},
            "client-vanishes": {"cell": "HANG 1/1", "verdicts": ["hang"]},
        },
        "resilient": {
            "utf8-sliced-stream": {"cell": "ok 1/1", "verdicts": ["complete"]},
            "client-vanishes": {"cell": "ok 1/1", "verdicts": ["complete"]},
        },
    }
    return matrix.matrix_document(
        ["scenarios/"], 3, rows, ["utf8-sliced-stream", "client-vanishes", "new-one"], cells
    )


# --- cells ---------------------------------------------------------------------------------


def test_a_cell_is_the_scorecards_worst_verdict_with_its_count_and_waste() -> None:
    cells = matrix.cells_of(
        document(
            ("reset-mid-stream", [result("raw", "silent_truncation", wasted=2)]),
            ("rate-limit-storm", [result("raw", "complete", "error_reported", passed=False)]),
        ),
        "raw",
    )
    assert cells["reset-mid-stream"] == {
        "cell": "SILENT 1/1 w2",
        "verdicts": ["silent_truncation"],
        "passed": True,
        "why": "",
    }
    assert cells["rate-limit-storm"]["cell"] == "error 1/2 ✗"
    assert cells["rate-limit-storm"]["passed"] is False


def test_a_hang_before_any_request_reached_the_proxy_says_the_client_never_started() -> None:
    slow = result("litellm", "hang")
    slow["requests"][0]["attempts"] = 0
    waited = result("openai", "hang")
    waited["requests"][0]["attempts"] = 1
    cells = matrix.cells_of(document(("client-vanishes", [slow, waited])), "litellm")
    assert cells["client-vanishes"]["cell"] == "HANG 1/1 (not started)"
    cells = matrix.cells_of(document(("client-vanishes", [slow, waited])), "openai")
    assert cells["client-vanishes"]["cell"] == "HANG 1/1"


def test_a_scenario_the_client_did_not_run_is_a_dash_with_the_reason() -> None:
    doc = document(("agent-only", [result("tools-naive", "complete")]))
    doc["scenarios"][0]["status"] = "needs the emulator: no ledger"
    assert matrix.cells_of(doc, "raw") == {
        "agent-only": {
            "cell": "-",
            "verdicts": [],
            "passed": None,
            "why": "needs the emulator: no ledger",
        }
    }


# --- clients and versions ------------------------------------------------------------------


def test_the_matrix_scores_every_runnable_client_but_the_agent_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "chromium_path", lambda: "/usr/bin/chromium")
    names = matrix.matrix_clients()
    assert {"raw", "openai", "browser", "aiohttp-naive", "openai-v1", "litellm"} <= set(names)
    assert set(names).isdisjoint(getattr(registry, "SCENARIO_CLIENTS", ()))


def test_versions_come_from_the_lock_the_venv_or_middlebox_itself() -> None:
    assert matrix.client_version("openai-v1", CLIENT_FACTS["openai-v1"]) == (
        envs.library_version("openai-v1")
    )
    assert matrix.client_version("aiohttp-lines", CLIENT_FACTS["aiohttp-lines"]) == (
        importlib.metadata.version("aiohttp")
    )
    assert matrix.client_version("resilient", CLIENT_FACTS["resilient"]) == (
        f"middlebox {middlebox.__version__}"
    )
    unknown = ClientFacts("no-such-distribution-x", "python", "", "", "")
    assert matrix.client_version("mine", unknown) == "?"


# The Node clients are registered whether or not node is installed; should a tree lack
# them, this skips on a developer's machine and fails under CI=true (`needs`).
NODE_REGISTERED = bool(getattr(registry, "NODE_CLIENTS", {}))


@needs(NODE_REGISTERED, "the Node clients (middlebox/clients/node)")
def test_a_node_clients_version_is_its_packages_pin() -> None:
    pinned = json.loads(matrix.NODE_PACKAGE.read_text())["dependencies"]
    assert matrix.client_version("node-openai", CLIENT_FACTS["node-openai"]) == pinned["openai"]


def test_every_matrix_client_states_its_defaults_and_fixes_only_known_symptoms() -> None:
    for name in set(registry.BUILTIN_CLIENTS) - set(getattr(registry, "SCENARIO_CLIENTS", ())):
        facts = CLIENT_FACTS[name]
        assert facts.timeout and facts.retries and facts.resume, name
        assert set(facts.fixes) <= set(SYMPTOMS), name
    assert "mojibake" in CLIENT_FACTS["aiohttp-naive"].fixes
    assert "incremental" in CLIENT_FACTS["aiohttp-naive"].fixes["mojibake"]


def test_a_client_row_carries_its_facts_and_version() -> None:
    row = matrix.client_row("httpx-sse")
    assert row["library"] == "httpx-sse"
    assert row["version"] == importlib.metadata.version("httpx-sse")
    assert row["timeout"].startswith("5 s")
    assert row["fixes"] == CLIENT_FACTS["httpx-sse"].fixes


# --- the Markdown --------------------------------------------------------------------------


def test_the_table_has_a_column_per_client_with_its_version_and_a_row_per_scenario() -> None:
    text = compatibility_markdown(two_client_matrix())
    assert "| scenario | `aiohttp-naive` (aiohttp 3.14.5) | `resilient` (middlebox 0.1.0) |" in text
    assert "| utf8-sliced-stream | MOJIBAKE 1/1 | ok 1/1 |" in text
    assert "| client-vanishes | HANG 1/1 | ok 1/1 |" in text
    assert "| new-one | - | - |" in text  # a scenario neither client ran


def test_the_defaults_table_escapes_pipes_so_a_row_stays_one_row() -> None:
    text = compatibility_markdown(two_client_matrix())
    assert "| `resilient` | middlebox 0.1.0 | 10 s stall | 3 \\| 8 | yes |" in text
    assert "| `aiohttp-naive` | aiohttp 3.14.5 | 300 s total | none | none |" in text


def test_each_silent_truncation_hang_or_mojibake_gets_its_librarys_fix() -> None:
    assert fixes_section(two_client_matrix()) == [
        "- `aiohttp-naive` (aiohttp 3.14.5), hang in client-vanishes: sock_read=10.",
        "- `aiohttp-naive` (aiohttp 3.14.5), mojibake in utf8-sliced-stream: decode incrementally.",
    ]


def test_a_symptom_without_a_recorded_fix_says_so_and_no_symptom_says_so_too() -> None:
    found = two_client_matrix()
    found["clients"][0]["fixes"] = {}
    assert fixes_section(found)[0].endswith("hang in client-vanishes: no fix recorded for "
                                            "this library.")  # fmt: skip
    for column in found["cells"].values():
        for entry in column.values():
            entry["verdicts"] = ["complete"]
    assert fixes_section(found) == ["Nothing silent: every client surfaced every failure it met."]


def test_the_page_says_how_it_was_made() -> None:
    text = compatibility_markdown(two_client_matrix())
    assert text.startswith("# Client compatibility\n")
    assert "`python -m middlebox.run.matrix scenarios/ --jobs 3`" in text
    assert "generated by `make matrix`" in text


# --- the command ---------------------------------------------------------------------------


def fake_suite(monkeypatch: pytest.MonkeyPatch, verdict: str, passed: bool) -> list[list[str]]:
    calls: list[list[str]] = []

    class Suite:
        def __init__(self, names: list[str]) -> None:
            self.names = names

        def document(self) -> dict[str, Any]:
            return document(
                ("healthy-baseline", [result(n, verdict, passed=passed) for n in self.names])
            )

    def run_suite(targets: list[str], *, client_names: list[str], **_: Any) -> Suite:
        calls.append(list(client_names))
        return Suite(list(client_names))

    monkeypatch.setattr(matrix, "run_suite", run_suite)
    monkeypatch.setattr(matrix, "prepare", lambda name: None)
    return calls


def test_the_command_runs_each_client_on_its_own_and_writes_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_suite(monkeypatch, "complete", True)
    out = tmp_path / "compatibility.md"
    code = matrix.main(
        ["x/", "--client", "raw", "--client", "aiohttp-lines", "--out", str(out),
         "--report", str(tmp_path / "r")]
    )  # fmt: skip
    assert code == 0
    assert calls == [["raw", "aiohttp-lines"]]  # two light clients share one run
    saved = json.loads((tmp_path / "r" / "matrix.json").read_text())
    assert [c["name"] for c in saved["clients"]] == ["raw", "aiohttp-lines"]
    assert saved["cells"]["raw"]["healthy-baseline"]["cell"] == "ok 1/1"
    assert "| healthy-baseline | ok 1/1 | ok 1/1 |" in out.read_text()


def test_without_scenarios_the_command_runs_the_whole_library_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_suite(monkeypatch, "complete", True)
    targets: list[list[str]] = []
    faked = matrix.run_suite
    monkeypatch.setattr(
        matrix, "run_suite", lambda paths, **kw: targets.append(list(paths)) or faked(paths, **kw)
    )
    out = tmp_path / "c.md"
    code = matrix.main(
        ["--client", "raw", "--jobs", "2", "--out", str(out), "--report", str(tmp_path)]
    )
    assert code == 0
    assert targets == [[]]  # run_suite's "no scenario: the whole library"
    assert "`python -m middlebox.run.matrix --jobs 2`" in out.read_text()


def test_a_failed_expectation_fails_the_command_but_the_table_is_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_suite(monkeypatch, "silent_truncation", False)
    out = tmp_path / "c.md"
    code = matrix.main(["x/", "--client", "raw", "--out", str(out), "--report", str(tmp_path)])
    assert code == 1
    assert "| healthy-baseline | SILENT 1/1 ✗ |" in out.read_text()
    assert "expectations failed in healthy-baseline/raw" in capsys.readouterr().err


def test_the_table_so_far_is_written_after_every_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_suite(monkeypatch, "complete", True)
    seen: list[list[str]] = []
    matrix.run_matrix(
        ["x/"], ["raw", "openai-v1"], jobs=1, report_dir=tmp_path,
        on_client=lambda so_far: seen.append([c["name"] for c in so_far["clients"]]),
    )  # fmt: skip
    assert seen == [["raw"], ["raw", "openai-v1"]]


def test_clients_run_in_batches_of_a_runtime_and_slow_importers_alone() -> None:
    assert matrix.batches(
        ["raw", "openai", "httpx-sse", "resilient", "aiohttp-lines", "aiohttp-naive",
         "openai-v1", "openai-v2", "langchain-openai", "litellm", "browser",
         "browser-eventsource", "node-openai"]
    ) == [
        ["raw", "openai", "httpx-sse", "resilient", "aiohttp-lines"],
        ["aiohttp-naive"],
        ["openai-v1", "openai-v2"],
        ["langchain-openai"],
        ["litellm"],
        ["browser", "browser-eventsource"],
        ["node-openai"],
    ]  # fmt: skip
    assert matrix.batches(["mine", "yours"]) == [["mine"], ["yours"]]  # unknown: alone


def test_an_update_keeps_the_columns_of_the_clients_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_suite(monkeypatch, "complete", True)
    earlier = two_client_matrix()
    updated = matrix.run_matrix(["x/"], ["resilient"], jobs=1, report_dir=tmp_path, earlier=earlier)
    assert calls == [["resilient"]]
    assert [c["name"] for c in updated["clients"]] == ["aiohttp-naive", "resilient"]
    assert updated["cells"]["aiohttp-naive"] == earlier["cells"]["aiohttp-naive"]
    assert updated["cells"]["resilient"]["healthy-baseline"]["cell"] == "ok 1/1"
    # the rows the update did not run stay as they were
    assert updated["cells"]["resilient"]["client-vanishes"]["cell"] == "ok 1/1"
    assert updated["scenarios"][-1] == "healthy-baseline"


def test_the_update_flag_reads_the_last_matrix_from_the_report_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_suite(monkeypatch, "complete", True)
    (tmp_path / "matrix.json").write_text(json.dumps(two_client_matrix()))
    out = tmp_path / "c.md"
    args = ["x/", "--client", "raw", "--update", "--out", str(out), "--report", str(tmp_path)]
    assert matrix.main(args) == 0
    header = next(line for line in out.read_text().splitlines() if line.startswith("| scen"))
    assert "`aiohttp-naive`" in header and "`resilient`" in header and "`raw`" in header


def test_an_unknown_client_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_suite(monkeypatch, "complete", True)
    with pytest.raises(SystemExit) as stopped:
        matrix.main(["x/", "--client", "nobody", "--out", str(tmp_path / "c.md")])
    assert stopped.value.code == 2
    assert calls == []


def test_preparing_a_locked_client_builds_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    monkeypatch.setattr(envs, "ensure", lambda name: built.append(name) or Path("/"))
    matrix.prepare("litellm")
    matrix.prepare("raw")
    assert built == ["litellm"]


# --- the committed table -------------------------------------------------------------------


def test_the_committed_table_names_every_client_with_its_version_and_every_scenario() -> None:
    text = (REPO / "docs" / "compatibility.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| scenario |"))
    agents = set(getattr(registry, "SCENARIO_CLIENTS", ()))
    missing = [
        name
        for name in registry.BUILTIN_CLIENTS
        if name not in agents and f"`{name}` (" not in header
    ]
    assert missing == [], "docs/compatibility.md: run `make matrix`"
    rows = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")}
    scenarios = sorted(path.stem for path in scenario_dir().glob("*.yaml"))
    assert [name for name in scenarios if name not in rows] == [], "run `make matrix`"
    for name in ("openai-v1", "openai-v2", "litellm", "langchain-openai"):
        assert envs.library_version(name) in header, name


def test_an_update_keeps_each_columns_own_date_unless_the_column_was_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_suite(monkeypatch, "complete", True)
    earlier = two_client_matrix()
    earlier["clients"][0]["ran"] = "2026-11-30 10:00-11:00 UTC"
    earlier["clients"][1]["ran"] = "2026-11-30 11:00-11:30 UTC"
    # a whole column run again (its rows, and the new one) takes this run's date
    earlier["cells"]["raw"] = {"healthy-baseline": {"cell": "HANG 1/1", "verdicts": ["hang"]}}
    earlier["clients"].append({**earlier["clients"][1], "name": "raw", "ran": "2026-11-29"})
    updated = matrix.run_matrix(
        ["x/"], ["resilient", "raw"], jobs=1, report_dir=tmp_path, earlier=earlier
    )
    assert calls == [["resilient", "raw"]]
    ran = {row["name"]: row["ran"] for row in updated["clients"]}
    # not run: its own date, untouched
    assert ran["aiohttp-naive"] == "2026-11-30 10:00-11:00 UTC"
    # one row of three run: the column's own date, and the row's
    assert re.fullmatch(
        r"2026-11-30 11:00-11:30 UTC; 1 of 3 rows \d{4}-\d\d-\d\d \d\d:\d\d-\d\d:\d\d UTC",
        ran["resilient"],
    ), ran["resilient"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d-\d\d:\d\d UTC", ran["raw"]), ran["raw"]
    assert "2026-11-29" not in ran["raw"]
