"""The Wi-Fi to LTE handoff on a background Responses stream against the real vLLM
(`middlebox run --upstream`, docs/real-vllm.md's procedure; the tier's server keeps
background responses, VLLM_ENABLE_RESPONSES_API_STORE=1).

responses-background-handoff: the resuming client (`openai-responses-resume`) shows the
server's whole answer, read from the journal (the union by sequence_number of what the
server sent on the create leg and on the resume leg), with no gap and no repeat, from one
generation and with nothing wasted. responses-background-restart: the client that creates
the response again is scored with what it redrew and what the first response, left running,
generated for nobody.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from realvllm.serve import Server
from tests.real_vllm.conftest import run_library_scenarios

SCENARIOS = ["responses-background-handoff", "responses-background-restart"]
RUN_TIMEOUT = 170  # seconds: two scenarios, up to three takes each


def _unmet(scenarios: dict[str, Any]) -> list[str]:
    return [
        f"{name}/{r['client']}: {r['verdicts']['requests']} "
        + "; ".join(f"{c['name']} {c['condition']} {c['expected']}: got {c['actual']}"
                    for c in unmet)
        for name, s in scenarios.items() for r in s["results"]
        if (unmet := [c for c in r["checks"] if not c["passed"]])
    ] + [p for s in scenarios.values() for p in s["problems"]]  # fmt: skip


def test_the_background_handoff_resumed_and_restarted_against_the_real_server(
    vllm_server: Server, middlebox_bin: str, tmp_path: Path
) -> None:
    done, scenarios = run_library_scenarios(
        middlebox_bin, vllm_server.url, SCENARIOS, tmp_path, RUN_TIMEOUT
    )
    assert not _unmet(scenarios), "\n".join(_unmet(scenarios)) + "\n" + done.stdout[-3000:]

    (resumed,) = scenarios["responses-background-handoff"]["results"]
    (request,) = resumed["requests"]
    metrics = resumed["metrics"]
    # the shown text is the server's whole answer from the journal's legs, once
    assert request["verdict"] == "complete", request
    assert request["expected_digest"] == request["shown_digest"]
    assert request["shown_chars"] == request["expected_chars"] > 0
    assert metrics["client.resumed"] >= 1 and metrics["client.amplification"] >= 2
    assert metrics["client.sequence_gaps"] == 0 and metrics["client.sequence_repeats"] == 0
    assert metrics["server.generations_per_request"] == 1
    assert metrics["server.tokens_wasted"] == 0
    assert metrics["server.background_left_running"] == 0

    (restarted,) = scenarios["responses-background-restart"]["results"]
    (again,) = restarted["requests"]
    metrics = restarted["metrics"]
    assert again["verdict"] in ("contradicted", "duplicated"), again
    assert metrics["client.resumed"] == 0
    assert metrics["server.generations_per_request"] == 2
    assert metrics["server.background_left_running"] == 1
    assert metrics["server.tokens_wasted"] >= 30
