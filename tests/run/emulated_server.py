"""The emulator standing in for a real server: one scenario run through `--upstream`'s path
(paced streams, sampled /metrics, clients one at a time, takes), with the raw client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from middlebox.clients import BUILTIN_CLIENTS
from middlebox.run.client_runs import ClientSpec
from middlebox.run.outcome import ScenarioOutcome
from middlebox.run.processes import CHILDREN, Children, start_emulator, stop_upstream
from middlebox.run.suite import run_scenario
from middlebox.run.upstream import UpstreamClient
from middlebox.scenario.model import Scenario


def run_against_emulated_server(
    scenario: Scenario, config: dict[str, Any], folder: Path, workdir: Path
) -> ScenarioOutcome:
    """`scenario` run by the raw client against an emulator started with `config` in
    `folder`, as against a real server; `config["max_model_len"]`, when given, is checked
    to be what the server lists."""

    async def main() -> ScenarioOutcome:
        CHILDREN.set(Children())
        emulator = await start_emulator(config, folder)
        try:
            if "max_model_len" in config:
                assert UpstreamClient(emulator.url).context() == config["max_model_len"]
            return await run_scenario(
                scenario, [ClientSpec("raw", list(BUILTIN_CLIENTS["raw"]))], seed=None,
                upstream_url=emulator.url, workdir=workdir,
            )  # fmt: skip
        finally:
            await stop_upstream(emulator)

    return trio.run(main)
