"""A client that ends without writing its result is reported with how it ended: its exit
status (or the signal that killed it) and the end of its stderr, or that its stderr was
empty, so a `--client-cmd` that fails silently still says something; one whose result breaks
the contract is reported with what is wrong in it, and neither is a hang. A real child
process (it exits at once; no upstream is dialled) and the scorer's problem line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from middlebox.compose import load
from middlebox.library import scenario_dir
from middlebox.observe.journal import JournalStore
from middlebox.run.client_runs import ClientRun, ClientSpec, run_client
from middlebox.run.outcome import ScenarioOutcome
from middlebox.run.processes import CHILDREN, Children
from middlebox.run.suite import score_runs
from middlebox.scenario.workload import Workload
from middlebox.shell.server import Address

HEALTHY = load(scenario_dir() / "healthy-baseline.yaml")


def ended(status: int | None, stderr: str = "") -> str:
    run = ClientRun(ClientSpec("mine", []), [], JournalStore(), exit_status=status)
    run.stderr_tail = stderr
    return run.missing_result()


def test_no_result_says_the_exit_status_and_that_stderr_was_empty() -> None:
    assert ended(3) == "the client wrote no result (it exited with status 3); its stderr was empty"
    assert ended(-9) == (
        "the client wrote no result (it was killed by signal SIGKILL); its stderr was empty"
    )
    assert ended(0, "  \n") == (
        "the client wrote no result (it exited with status 0); its stderr was empty"
    )


def test_no_result_with_something_on_stderr_shows_its_end_and_never_calls_it_empty() -> None:
    said = ended(1, "Traceback ...\nKeyError: 'choices'\n")
    assert said == (
        "the client wrote no result (it exited with status 1); its stderr ends with: "
        "Traceback ...\nKeyError: 'choices'"
    )
    assert "empty" not in said
    assert ended(1, "x" * 1000).endswith("ends with: " + "x" * 400)


def test_a_client_that_exits_non_zero_without_output_is_a_problem_with_its_status(
    tmp_path: Path,
) -> None:
    spec = ClientSpec("mine", [sys.executable, "-c", "raise SystemExit(3)"])

    async def main() -> ClientRun:
        CHILDREN.set(Children())
        with trio.fail_after(30):
            return await run_client(
                spec, HEALTHY, Workload(requests=1), Address("127.0.0.1", 9), "m", tmp_path
            )

    run = trio.run(main)
    assert (run.result, run.hang, run.exit_status, run.stderr_tail) == (None, False, 3, "")
    outcome = ScenarioOutcome(HEALTHY, HEALTHY.seed)
    score_runs(outcome, [run], [spec], [spec], [], {}, tmp_path)
    assert outcome.problems[0] == (
        "healthy-baseline/mine: the client wrote no result (it exited with status 3); "
        "its stderr was empty"
    )


def ended_writing(tmp_path: Path, text: str) -> ClientRun:
    """A client that writes `text` to its result file and exits 0."""
    code = "import os; open(os.environ['MIDDLEBOX_RESULT'], 'w').write(os.environ['WRITE'])"
    spec = ClientSpec("mine", [sys.executable, "-c", code])

    async def main() -> ClientRun:
        CHILDREN.set(Children())
        with pytest.MonkeyPatch.context() as patch, trio.fail_after(30):
            patch.setenv("WRITE", text)
            return await run_client(
                spec, HEALTHY, Workload(requests=2), Address("127.0.0.1", 9), "m", tmp_path
            )

    return trio.run(main)


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("[1,2]", 'the result: expected an object {"client": ..., "results": [...]}, got [1, 2]'),
        ('{"client":"x","results":[{"index":"zero"}]}',
         'results[0].index: expected an integer, got "zero"'),
        ('{"client":"x","results":[{"index":0,"chunks":"nope"}]}',
         'results[0].chunks: expected a list of [display_time, text_piece] pairs, got "nope"'),
        ('{"client":"x"', "not JSON: Expecting ',' delimiter at line 1 column 14"),
        ('{"client":"x"}', '"results" is missing (a list with an entry per workload request)'),
    ],
)  # fmt: skip
def test_a_result_that_breaks_the_contract_is_its_clients_problem_naming_what_is_wrong(
    tmp_path: Path, written: str, said: str
) -> None:
    run = ended_writing(tmp_path, written)
    assert (run.result, run.hang, run.exit_status, run.result_error) == (None, False, 0, said)
    outcome = ScenarioOutcome(HEALTHY, HEALTHY.seed)
    score_runs(outcome, [run], [run.spec], [run.spec], [], {}, tmp_path)
    assert outcome.problems[0] == (
        "healthy-baseline/mine: its result file breaks the client contract "
        f"(docs/clients.md, Result): {said}"
    )
    assert "wrote no result" not in outcome.problems[0]
    assert outcome.scores[0].verdicts()["requests"] == ["no_result", "no_result"]
    assert outcome.scores[0].metrics["client.hangs"] == 0


def test_a_result_that_keeps_the_contract_is_scored_with_no_problem_of_its_own(
    tmp_path: Path,
) -> None:
    entries = [
        {"index": index, "text": "", "error": "APIConnectionError: refused", "chunks": []}
        for index in (1, 0)
    ]
    document = {"client": "mine", "results": entries}
    run = ended_writing(tmp_path, json.dumps(document))
    assert (run.result, run.result_error) == (document, None)
    outcome = ScenarioOutcome(HEALTHY, HEALTHY.seed)
    score_runs(outcome, [run], [run.spec], [run.spec], [], {}, tmp_path)
    assert not [problem for problem in outcome.problems if "result" in problem]
    assert outcome.scores[0].verdicts()["requests"] == ["error_reported", "error_reported"]
