"""`middlebox run --upstream` against the real vLLM: a few library scenarios meet their
expectations with the server side measured (sampled /metrics + the journal's token
times), and a scenario that needs the emulator is reported as such, not run.

A bounded slice of the whole-library run docs/real-vllm.md records ("The scenario
library against a real vLLM"): abandon-direct and abandon-through-nginx-default (aborts
seen, tokens wasted within the emulator's bounds), reset-mid-stream (a cut the server
sees: every client's verdict, resilient's redraw of a sampled answer included) and
vllm-engine-error (emulator-only: an in-band error after N tokens).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from realvllm.serve import Server
from tests.real_vllm.conftest import ROOT

SCENARIOS = [
    "abandon-direct",
    "abandon-through-nginx-default",
    "reset-mid-stream",
    "vllm-engine-error",
]
RUN_TIMEOUT = 170  # seconds; the brief: under ~3 minutes on 2 shared cores


def test_library_scenarios_with_upstream_meet_their_expectations(
    vllm_server: Server, middlebox_bin: str, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    paths = [str(ROOT / "scenarios" / f"{name}.yaml") for name in SCENARIOS]
    done = subprocess.run(
        [middlebox_bin, "run", *paths, "--upstream", vllm_server.url, "--report", str(report)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT,
    )  # fmt: skip
    document = json.loads((report / "report.json").read_text())
    scenarios = {s["name"]: s for s in document["scenarios"]}
    failed = [
        f"{name}/{r['client']}: {r['verdicts']['requests']} "
        + "; ".join(f"{c['name']} {c['condition']} {c['expected']}: got {c['actual']}"
                    for c in r["checks"] if not c["passed"])
        for name, s in scenarios.items() for r in s["results"] if not r["passed"]
    ] + [p for s in scenarios.values() for p in s["problems"]]  # fmt: skip
    assert not failed, "\n".join(failed) + "\n" + done.stdout[-3000:]
    assert done.returncode == 0, done.stdout[-3000:]

    engine_error = scenarios["vllm-engine-error"]
    assert engine_error["status"] == "needs the emulator" and not engine_error["results"]
    assert engine_error["needs_emulator"].startswith("upstream.fail_after_tokens: ")
    assert "vllm-engine-error: needs the emulator: upstream.fail_after_tokens" in done.stdout

    for name in ("abandon-direct", "abandon-through-nginx-default"):
        for result in scenarios[name]["results"]:
            metrics = result["metrics"]
            assert result["verdicts"]["requests"] == ["abandoned"], (name, result["client"])
            assert metrics["server.aborted"] == 1, (name, result["client"])  # measured, not 0
            assert metrics["server.generations"] == 1
            assert 0 < metrics["server.tokens_generated"] < scenarios[name]["paced"]["max_tokens"]
            assert len(metrics["server.abort_latency_ms"]) == 1
    wasted = [r["metrics"]["server.tokens_wasted"] for r in scenarios["abandon-direct"]["results"]]
    assert max(wasted) <= 3, wasted  # abandon-direct's own bound, as with the emulator

    reset = {r["client"]: r for r in scenarios["reset-mid-stream"]["results"]}
    assert reset["raw"]["verdicts"]["requests"] == ["silent_truncation"]
    assert reset["openai"]["verdicts"]["requests"] == ["truncation_detected"]
    # the resilient client restarts without a seed: vLLM samples a different answer
    assert reset["resilient"]["verdicts"]["requests"] == ["contradicted"]
    assert reset["resilient"]["metrics"]["server.generations"] == 2
