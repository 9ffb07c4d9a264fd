"""An upstream that exits at start is a scenario problem with its cause: the launcher names the
exit status and the child's last error line (click's `Error: ...`, a traceback's last line),
keeps all it said in the log, and a suite run reports that line as the scenario's problem
instead of running clients against nothing (no client failure, no 500)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from middlebox.run.client_runs import ClientSpec
from middlebox.run.processes import (
    EmulatorProcess,
    UpstreamProcess,
    UpstreamStartError,
    last_error_line,
)
from middlebox.run.suite import run_scenario
from middlebox.scenario.model import Scenario

CLICK_USAGE_ERROR = (
    "Usage: python -m vllm_emulator [OPTIONS]\n"
    "Try 'python -m vllm_emulator --help' for help.\n\n"
    "Error: emulator.yaml.itl: expected a duration such as 250ms or 2s, got 'fast'\n"
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "serve.py", line 9, in <module>\n'
    "    open(cassette)\n"
    "FileNotFoundError: [Errno 2] No such file or directory: 'tapes/x.json'\n"
)


def test_the_cause_is_the_last_line_that_names_an_error() -> None:
    assert last_error_line(CLICK_USAGE_ERROR) == (
        "Error: emulator.yaml.itl: expected a duration such as 250ms or 2s, got 'fast'"
    )
    assert last_error_line(TRACEBACK).startswith("FileNotFoundError: [Errno 2]")
    assert last_error_line("starting\nport 8000 taken, giving up\n") == "port 8000 taken, giving up"
    assert last_error_line("Traceback (most recent call last):\n") == (
        "Traceback (most recent call last):"
    )
    assert last_error_line("\n\n") == "(it wrote nothing)"


def test_a_child_that_exits_at_start_names_its_status_and_its_last_error_line(
    tmp_path: Path,
) -> None:
    log = tmp_path / "child.log"
    body = f"import sys; sys.stdout.write({TRACEBACK!r}); sys.exit(3)"
    with pytest.raises(UpstreamStartError) as caught:
        UpstreamProcess([sys.executable, "-c", body], lambda line: None, log=log)
    error = caught.value
    assert error.status == 3
    assert str(error).startswith("the upstream exited at start (exit status 3): FileNotFoundError")
    assert str(error).endswith(f"(its output: {log})")
    assert error.output == TRACEBACK and log.read_text() == TRACEBACK


def test_the_emulator_refusing_its_config_says_which_option_and_why(tmp_path: Path) -> None:
    with pytest.raises(UpstreamStartError) as caught:
        EmulatorProcess({"itl": "fast"}, tmp_path)
    error = caught.value
    assert error.status == 2  # click's usage error
    assert error.cause.startswith("Error: ") and "itl" in error.cause and "'fast'" in error.cause
    assert "Usage:" not in str(error)  # the line that matters, not the usage banner
    assert "Usage:" in (tmp_path / "emulator.log").read_text()


async def test_an_emulator_exiting_at_start_is_a_scenario_problem_with_its_cause_not_a_client_fail(
    tmp_path: Path,
) -> None:
    scenario = Scenario(name="bad-upstream", sections={"upstream": {"itl": "fast"}})
    raw = ClientSpec("raw", [sys.executable, "-m", "middlebox.clients.raw"])
    outcome = await run_scenario(scenario, [raw], seed=1, upstream_url=None, workdir=tmp_path)
    (problem,) = outcome.problems
    assert problem.startswith("bad-upstream: the emulator exited at start (exit status 2): Error: ")
    assert "itl" in problem and "'fast'" in problem
    assert outcome.scores == []  # no client ran against a server that is not there
