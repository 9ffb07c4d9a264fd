"""The whole-library table docs/real-vllm.md quotes, written from a run's report.json
(realvllm.library_table; needs no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from realvllm.library_table import CLIENTS, main, rows


def result(client: str, passed: bool, verdicts: list[str], **metrics: Any) -> dict[str, Any]:
    checks = [{"name": "client.complete", "condition": "equals", "expected": 1,
               "actual": 1 if passed else 0, "passed": passed, "note": ""}]  # fmt: skip
    if not passed:
        checks.append({"name": "server.tokens_wasted", "condition": "max", "expected": 3,
                       "actual": 9, "passed": False, "note": "in decoding time"})  # fmt: skip
    return {"client": client, "passed": passed, "verdicts": {"requests": verdicts},
            "metrics": metrics, "checks": checks}  # fmt: skip


REPORT = {
    "scenarios": [
        {"name": "abandon-x", "problems": [], "needs_emulator": None,
         "paced": {"server_ms_per_token": 4.2, "tokens_per_frame": 1.5, "max_tokens": 900},
         "results": [
             result("raw", True, ["abandoned"], **{"client.abandoned": 1, "server.aborted": 1,
                                                    "server.tokens_wasted": 2}),
             result("openai", False, ["abandoned"], **{"client.abandoned": 1,
                                                        "server.aborted": 1,
                                                        "server.tokens_wasted": 9}),
         ]},
        {"name": "cut-y", "needs_emulator": None, "paced": {},
         "problems": ["cut-y/openai: declared fault 'cut' fired for raw but never for openai"],
         "results": [result("raw", True, ["silent_truncation", "silent_truncation"]),
                     result("openai", True, ["complete"])]},
        {"name": "pause-z", "needs_emulator": "upstream.pauses: a stall", "problems": [],
         "results": []},
        {"name": "long-w", "needs_emulator": None, "problems": [], "results": [],
         "needs_context": "needs a context of 2466 tokens, the server has 2048: start vLLM "
                          "with --max-model-len 4096"},
    ]
}  # fmt: skip


def test_each_run_is_met_or_not_with_its_verdicts_and_failed_checks() -> None:
    lines, counts = rows(REPORT)
    assert lines[0].startswith("| scenario | raw | openai | httpx-sse | resilient |")
    abandon, cut, pause, long = lines[2:]
    assert "| met (abandoned ab1 w2) |" in abandon
    assert (
        "**not met** (abandoned ab1 w9) — client.complete equals 1: got 0; "
        "server.tokens_wasted max 3: got 9 (in decoding time) |"
    ) in abandon
    assert abandon.endswith("| 4.2, 1.5, 900 |")
    # a proof problem naming a client counts against that client only
    assert cut.startswith("| cut-y — cut-y/openai: declared fault")
    assert "| met (silent_truncation) |" in cut  # one verdict per kind
    assert pause == "| pause-z | needs the emulator: upstream.pauses: a stall |"
    assert long == (
        "| long-w | needs a context of 2466 tokens, the server has 2048: start vLLM with "
        "--max-model-len 4096 |"
    )
    assert counts == {"met": 2, "not met": 2, "needs the emulator": 1, "needs a larger context": 1}


def test_the_command_prints_the_table_and_the_counts(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(REPORT))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(
        "2/4 scenario-client runs met their expectations; 2 not met; 1 scenarios need the "
        "emulator; 1 need a larger context"
    )


def test_a_client_of_a_scenarios_own_gets_a_column_after_the_defaults() -> None:
    # the Responses handoff scored its resuming client only: its run is counted, in a column
    # of its own after the default ones, and a default client that ran nowhere still has one
    handoff = {
        "name": "responses-background-handoff", "needs_emulator": None, "problems": [],
        "paced": {}, "results": [{
            "client": "openai-responses-resume", "passed": True, "checks": [],
            "verdicts": {"requests": ["complete"]}, "metrics": {},
        }],
    }  # fmt: skip
    lines, counts = rows({"scenarios": [*REPORT["scenarios"], handoff]})
    header = lines[0].split(" | ")
    assert header[-2:] == ["openai-responses-resume", "server ms/token, tokens/frame, max_tokens |"]
    assert "tools-naive" in header  # the defaults stay, run or not
    assert lines[-1].startswith("| responses-background-handoff |")
    assert lines[-1].split(" | ")[-2] == "met (complete)"
    assert counts["met"] == 3  # the two of REPORT and this one
    # a report with the default clients alone has their columns alone
    assert rows(REPORT)[0][0].count(" | ") == len(CLIENTS) + 1
