"""A scenario asking for the Responses store (`upstream.responses_store`) against a real
server: the server is asked before any client runs, and one started without the store
(vLLM without VLLM_ENABLE_RESPONSES_API_STORE=1) is named as the problem, not scored as the
clients' failures (suite.store_problem, upstream.keeps_background_responses)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio

from middlebox.compose import load
from middlebox.library import scenario_dir
from middlebox.run.processes import CHILDREN, Children, start_emulator, stop_upstream
from middlebox.run.suite import STORE_NEEDED, needs_emulator, store_problem
from middlebox.run.upstream import UpstreamClient
from tests.run.emulated_server import run_against_emulated_server

HANDOFF = "responses-background-handoff.yaml"


def _asked(store: bool, scenario_name: str, folder: Path) -> str | None:
    folder.mkdir()

    async def main() -> str | None:
        CHILDREN.set(Children())
        emulator = await start_emulator({"seed": 1, "responses_store": store}, folder)
        try:
            scenario = load(scenario_dir() / scenario_name)
            upstream = UpstreamClient(emulator.url)
            return await store_problem(scenario, upstream, upstream.model())
        finally:
            await stop_upstream(emulator)

    return trio.run(main)


@pytest.mark.e2e
def test_a_server_without_the_store_is_named_and_one_with_it_is_not(tmp_path: Path) -> None:
    assert _asked(False, HANDOFF, tmp_path / "off") == STORE_NEEDED
    assert _asked(True, HANDOFF, tmp_path / "on") is None
    # a scenario that does not ask for the store asks the server nothing
    assert _asked(False, "reset-mid-stream.yaml", tmp_path / "plain") is None
    assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in STORE_NEEDED


def test_the_store_is_a_real_servers_switch_not_emulator_behaviour() -> None:
    scenario = load(scenario_dir() / HANDOFF)
    assert scenario.sections["upstream"].responses_store is True
    assert needs_emulator(scenario) is None
    # and a field the real server has no switch for still needs the emulator
    changed = dataclasses.replace(scenario.sections["upstream"], resumable=True)
    resumable = dataclasses.replace(scenario, sections={**scenario.sections, "upstream": changed})
    assert needs_emulator(resumable) == (
        "upstream.resumable: resumable streams (a gateway pattern vLLM lacks)"
    )


@pytest.mark.e2e
def test_a_run_against_a_server_without_the_store_fails_with_that_line(tmp_path: Path) -> None:
    scenario = load(scenario_dir() / HANDOFF)
    config = {"seed": 3, "itl": 0.001, "prefill_overhead": 0.005}
    outcome = run_against_emulated_server(scenario, config, tmp_path, tmp_path / "run")
    assert outcome.scores == []
    assert outcome.problems == [f"{scenario.source}: {STORE_NEEDED}"]
