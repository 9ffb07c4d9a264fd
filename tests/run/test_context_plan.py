"""A real server's context bounds the streams a run plans (middlebox.run.context_plan).

A vLLM serving `--max-model-len 2048` answers 400 to `max_tokens=2547`; a run that planned
that stream would score the server's refusal as the clients' failure. Planned within the
context, a stream is cut to the room left while it still covers the scenario's own length at
the server's pace; otherwise the scenario says in one line what context it needs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from middlebox.compose import expand_paths, load
from middlebox.library import scenario_dir
from middlebox.report.scorecard import junit_xml, scorecard
from middlebox.run.context_plan import (
    PROMPT_TEMPLATE_ALLOWANCE,
    prompt_token_bound,
    suggested_context,
    within_context,
)
from middlebox.run.outcome import SuiteOutcome
from middlebox.run.suite import paced
from middlebox.scenario.workload import Workload
from tests.run.emulated_server import run_against_emulated_server

TOOLS = [{"type": "function", "function": {"name": "send_email", "parameters": {
    "type": "object", "properties": {"to": {"type": "string"}}}}}]  # fmt: skip


def test_a_stream_that_fits_is_left_as_planned() -> None:
    planned, least = Workload(max_tokens=1500), Workload(max_tokens=900)
    assert within_context(planned, least, 2048, 300) == (planned, None)
    assert within_context(planned, least, None, 300) == (planned, None)  # no context listed


def test_a_stream_too_long_is_cut_to_the_room_left_when_the_scenario_still_fits() -> None:
    planned, least = Workload(max_tokens=2547), Workload(max_tokens=1500)
    cut, line = within_context(planned, least, 2048, 300)
    assert line is None
    assert cut.max_tokens == 2048 - 300
    assert cut == Workload(max_tokens=1748)  # nothing else changed


def test_a_scenario_longer_than_the_context_says_what_to_start_the_server_with() -> None:
    planned, least = Workload(max_tokens=3167), Workload(max_tokens=2000)
    kept, line = within_context(planned, least, 2048, 300)
    assert kept is planned
    assert line == (
        "needs a context of 2300 tokens, the server has 2048: start vLLM with --max-model-len 4096"
    )
    assert "\n" not in line


def test_suggested_context_is_the_power_of_two_at_or_above() -> None:
    assert [suggested_context(n) for n in (2, 1000, 1024, 1025, 2300)] == [
        2,
        1024,
        1024,
        2048,
        4096,
    ]


def test_the_prompt_bound_covers_its_bytes_the_tools_and_the_template() -> None:
    plain = prompt_token_bound(Workload(prompt_words=16), "abandon-direct", "chat")
    longer = prompt_token_bound(Workload(prompt_words=400), "abandon-direct", "chat")
    with_tools = prompt_token_bound(Workload(tools=TOOLS), "abandon-direct", "chat")
    assert PROMPT_TEMPLATE_ALLOWANCE + 16 * 3 < plain < longer
    assert with_tools >= plain + len(json.dumps(TOOLS))


@pytest.mark.parametrize("context", [8192, 2048])
def test_at_the_tiers_pace_the_library_fits_its_context_or_says_so(context: int) -> None:
    # the tier's CPU vLLM: 3-8 ms a token, tokens one or two a frame (docs/real-vllm.md)
    needs: dict[str, str] = {}
    for path in expand_paths([scenario_dir()]):
        scenario = load(path)
        workload = scenario.sections.get("workload") or Workload()
        for seconds_per_token, per_frame in ((0.003, 1.0), (0.008, 1.6)):
            args = (workload, scenario, seconds_per_token, per_frame)
            planned, line = within_context(
                paced(*args), paced(*args, margins=False), context,
                prompt_token_bound(workload, scenario.name, "chat"),
            )  # fmt: skip
            if line:
                needs[scenario.name] = line
            else:
                bound = prompt_token_bound(workload, scenario.name, "chat")
                assert planned.max_tokens + bound <= context, scenario.name
    if context == 8192:
        assert needs == {}  # the tier's server: nothing is said
    assert all(line.startswith("needs a context of ") for line in needs.values())


def _run_against(tmp_path: Path, max_model_len: int) -> tuple[Any, dict[str, Any]]:
    scenario = load(scenario_dir() / "abandon-direct.yaml")  # 300 tokens at 15 ms
    workdir = tmp_path / f"run-{max_model_len}"

    # the emulator as the "real" server, at 1 ms a token: paced to ~9,500 ms of stream
    config = {"seed": 3, "itl": 0.001, "prefill_overhead": 0.005, "max_model_len": max_model_len}
    outcome = run_against_emulated_server(scenario, config, tmp_path, workdir)
    return outcome, SuiteOutcome([outcome], None, ["raw"]).document()


@pytest.mark.e2e
def test_a_small_context_is_said_in_one_line_and_not_scored_as_the_clients(
    tmp_path: Path,
) -> None:
    outcome, document = _run_against(tmp_path, 1024)
    assert outcome.scores == [] and outcome.problems == []
    line = outcome.needs_context
    assert line, outcome.paced
    found = re.fullmatch(
        r"needs a context of (\d+) tokens, the server has 1024: "
        r"start vLLM with --max-model-len (\d+)", line,
    )  # fmt: skip
    assert found, line
    needed, suggested = int(found.group(1)), int(found.group(2))
    assert 1024 < needed <= suggested  # paced from 300 tokens at 15 ms to ~1 ms a token
    assert document["scenarios"][0]["status"] == "needs a larger context"
    card = scorecard(document, colour=False)
    assert f"abandon-direct: {line}" in card.splitlines()
    assert "FAIL" not in card and card.rstrip().endswith("PASS")
    assert f'<skipped message="{line}"' in junit_xml(document).decode()


@pytest.mark.e2e
def test_a_context_that_holds_the_stream_is_not_mentioned(tmp_path: Path) -> None:
    outcome, document = _run_against(tmp_path, 16384)
    assert outcome.needs_context is None
    assert document["scenarios"][0]["status"] == "ran"
    assert "needs a context" not in scorecard(document, colour=False)
    assert len(outcome.scores) == 1
    assert 300 < outcome.paced["max_tokens"] < 16384  # paced past the scenario's own 300
