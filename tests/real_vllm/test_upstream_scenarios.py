"""`middlebox run --upstream` against the real vLLM: a few library scenarios meet their
expectations with the server side measured (sampled /metrics + the journal's token
times), and a scenario that needs the emulator is reported as such, not run.

A bounded slice of the whole-library run docs/real-vllm.md records ("The scenario
library against a real vLLM"): abandon-direct (aborts seen, tokens wasted within the
scenario's bound judged in decoding time by the scorer), reset-mid-stream (a cut the server
sees: every client's verdict; resilient's seeded restart draws the same answer) and
vllm-engine-error (emulator-only: an in-band error after N tokens).
"""

from __future__ import annotations

from pathlib import Path

from realvllm.serve import Server
from tests.real_vllm.conftest import run_library_scenarios

# abandon-through-nginx-default is not in this slice yet: behind the buffering preset the
# real-server scorer sometimes reports server.aborted 0 for a client that left (seen once in
# CI for resilient); it stays in the whole-library run (docs/real-vllm.md) until that is found.
SCENARIOS = [
    "abandon-direct",
    "reset-mid-stream",
    "vllm-engine-error",
]
RUN_TIMEOUT = 170  # seconds; the brief: under ~3 minutes on 2 shared cores


def test_library_scenarios_with_upstream_meet_their_expectations(
    vllm_server: Server, middlebox_bin: str, tmp_path: Path
) -> None:
    done, scenarios = run_library_scenarios(
        middlebox_bin, vllm_server.url, SCENARIOS, tmp_path, RUN_TIMEOUT
    )
    # `server.tokens_wasted: {max: 3}` is written for the emulator's pace (3 tokens at the
    # scenario's 15 ms ITL, 45 ms of decoding); the tiny real model decodes a token in
    # 1-5 ms, so the scorer judges that bound in decoding time (suite.in_decoding_time).
    # Every check must pass.
    failed = [
        f"{name}/{r['client']}: {r['verdicts']['requests']} "
        + "; ".join(f"{c['name']} {c['condition']} {c['expected']}: got {c['actual']} "
                    f"{c.get('note', '')}" for c in unmet)
        for name, s in scenarios.items() for r in s["results"]
        if (unmet := [c for c in r["checks"] if not c["passed"]])
    ] + [p for s in scenarios.values() for p in s["problems"]]  # fmt: skip
    assert not failed, "\n".join(failed) + "\n" + done.stdout[-3000:]
    assert "vllm-engine-error: needs the emulator" in done.stdout, done.stdout[-3000:]

    engine_error = scenarios["vllm-engine-error"]
    assert engine_error["status"] == "needs the emulator" and not engine_error["results"]
    assert engine_error["needs_emulator"].startswith("upstream.fail_after_tokens: ")
    assert "vllm-engine-error: needs the emulator: upstream.fail_after_tokens" in done.stdout

    for name in ("abandon-direct",):
        for result in scenarios[name]["results"]:
            metrics = result["metrics"]
            seen = (name, result["client"], scenarios[name]["paced"], metrics)
            assert result["verdicts"]["requests"] == ["abandoned"], seen
            assert metrics["server.aborted"] == 1, seen  # measured, not 0
            assert metrics["server.generations"] == 1, seen
            paced_tokens = scenarios[name]["paced"]["max_tokens"]
            assert 0 < metrics["server.tokens_generated"] < paced_tokens, seen
            assert len(metrics["server.abort_latency_ms"]) == 1, seen
    for result in scenarios["abandon-direct"]["results"]:
        (wasted,) = [c for c in result["checks"] if c["name"] == "server.tokens_wasted"]
        assert wasted["note"].startswith("judged in decoding time: 3 tokens at the scenario's 15")

    reset = {r["client"]: r for r in scenarios["reset-mid-stream"]["results"]}
    assert reset["raw"]["verdicts"]["requests"] == ["silent_truncation"]
    assert reset["openai"]["verdicts"]["requests"] == ["truncation_detected"]
    # the resilient client restarts with the same per-request seed: vLLM draws the same
    # answer again, so nothing the user read is contradicted
    assert reset["resilient"]["verdicts"]["requests"] == ["complete"]
    assert reset["resilient"]["metrics"]["server.generations"] == 2
