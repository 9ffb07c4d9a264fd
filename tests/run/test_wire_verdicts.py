"""Verdicts from the wire in the runner: per-client fault proof, `--client-cmd` names, seeds
that reach the emulator, and `replay` comparing the generated and shown text as well as
the verdicts (shown text the upstream's timing split otherwise is noted, not failed)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from middlebox.cli.main import main
from middlebox.compose import load
from middlebox.library import scenario_dir
from middlebox.run.client_runs import resolve_clients
from middlebox.run.outcome import SuiteOutcome, UsageError
from middlebox.run.processes import EmulatorProcess, emulator_config
from middlebox.run.replay import compare_texts
from middlebox.run.suite import proof_problems

LIBRARY = scenario_dir()


def test_a_fault_that_fired_for_some_clients_but_never_for_one_is_that_ones_problem() -> None:
    proof = {
        "connections": {"openai": 1, "browser-eventsource": 2},
        "faults": {
            "cut": {
                "fired": 1,
                "bypassed": 2,
                "clients_fired": ["openai"],
                "clients_bypassed": ["browser-eventsource"],
            }
        },
    }
    problems = proof_problems("s", proof)
    assert problems == [
        "s/browser-eventsource: declared fault 'cut' fired for openai but never for "
        "browser-eventsource: its verdict does not test the fault"
    ]
    quiet = proof_problems("s", proof, quiet_faults=("cut",))
    assert not any("never for" in problem for problem in quiet)


def test_a_client_cmd_name_is_anything_without_an_equals_sign() -> None:
    (spec,) = resolve_clients([], ["own-openai=python x.py"])
    assert (spec.name, spec.argv) == ("own-openai", ["python", "x.py"])
    (plain,) = resolve_clients([], ["python -c 'a=1'"])
    assert (plain.name, plain.argv) == ("custom", ["python", "-c", "a=1"])


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("mine=no-such-program-xyz x.py", "'no-such-program-xyz' is not an executable program"),
        ("mine=", "no command to run"),
        ("mine=python 'x.py", "No closing quotation"),
    ],
)
def test_a_bad_client_cmd_is_one_clear_error(command: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        resolve_clients([], [command])


def test_a_bad_client_cmd_on_the_cli_is_a_one_line_usage_error_without_a_traceback() -> None:
    scenario = str(LIBRARY / "healthy-baseline.yaml")
    result = CliRunner().invoke(
        main, ["run", scenario, "--client-cmd", "own-openai=no-such-program-xyz x.py"]
    )
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "no-such-program-xyz" in errors[0]
    assert "Traceback" not in result.output


def test_the_runs_seed_reaches_the_emulator_config() -> None:
    scenario = load(LIBRARY / "healthy-baseline.yaml")
    assert emulator_config(scenario, 12345)["seed"] == 12345
    assert emulator_config(scenario, scenario.seed)["seed"] == scenario.seed


def _completion(url: str) -> str:
    body = json.dumps({"prompt": "[middlebox seed/raw/0] hi", "max_tokens": 24}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.load(response)["choices"][0]["text"])


@pytest.mark.e2e
def test_two_seeds_give_different_text_and_the_same_seed_the_same(tmp_path: Path) -> None:
    scenario = load(LIBRARY / "healthy-baseline.yaml")
    texts = []
    for number, seed in enumerate([1, 2, 1]):
        emulator = EmulatorProcess(
            emulator_config(scenario, seed), tmp_path, name=f"emulator{number}"
        )
        try:
            texts.append(_completion(emulator.url))
        finally:
            emulator.stop()
    assert texts[0] == texts[2]
    assert texts[0] != texts[1]


def _report(expected: str, shown: str, split: list[int] | None = None) -> dict[str, object]:
    request: dict[str, object] = {"index": 0, "verdict": "complete",
                                  "expected_digest": expected, "shown_digest": shown}  # fmt: skip
    if split is not None:
        request["upstream_split"] = ",".join(map(str, split))  # as the scorer writes it
    return {"scenarios": [{"name": "s", "results": [{"client": "raw", "requests": [request]}]}]}


def test_replay_compares_the_generated_and_shown_text_not_only_the_verdicts() -> None:
    assert compare_texts(_report("a1", "b1"), _report("a1", "b1")).differences == []
    assert compare_texts(_report("a1", "b1"), _report("a2", "b1")).differences == [
        "s/raw: request 0: generated text differs"
    ]
    assert compare_texts(_report("a1", "b1"), _report("a1", "b2")).differences == [
        "s/raw: request 0: shown text differs"
    ]
    # a report from before the digests has nothing to compare
    assert compare_texts(_report("", ""), _report("a1", "b1")).differences == []


TIMING_NOTE = (
    "s/raw: request 0: shown text differs, and the upstream split the same text into"
    " other events (its writer lagged and merged tokens: the run's timing, not its seed)"
)


def test_shown_text_that_differs_with_the_upstream_s_split_is_noted_not_failed() -> None:
    # The same text, two tokens merged into one event in the rerun (a lagging writer):
    # a counted cut lands elsewhere, so the shown text may differ. Timing: a note.
    merged = (_report("a1", "b1", [2, 3, 1, 4]), _report("a1", "b2", [5, 1, 4]))
    assert compare_texts(*merged).differences == []
    assert compare_texts(*merged).notes == [TIMING_NOTE]
    # The same split, only longer in one run (the upstream heard the reset later), and
    # other shown text: a difference, and no note.
    for split in ([2, 3, 1, 4], [2, 3, 1, 4, 2, 2]):
        pair = (_report("a1", "b1", [2, 3, 1, 4]), _report("a1", "b2", split))
        assert compare_texts(*pair).differences == ["s/raw: request 0: shown text differs"]
        assert compare_texts(*pair).notes == []
    # Another generated text fails whatever the split; a report without the split (or an
    # upstream that sent no events for it) cannot excuse shown text.
    assert compare_texts(_report("a1", "b1", [2, 3]), _report("a2", "b1", [5])).differences == [
        "s/raw: request 0: generated text differs"
    ]
    for before, after in (([], [5, 1]), ([2, 3], []), (None, [5, 1])):
        pair = (_report("a1", "b1", before), _report("a1", "b2", after))
        assert compare_texts(*pair).differences == ["s/raw: request 0: shown text differs"]
        assert compare_texts(*pair).notes == []


def _storm_checks(attempts: int, error: str | None) -> list[bool]:
    """rate-limit-always's expectations for one client whose single request made
    `attempts` requests on the wire, each answered 429 by the gateway."""
    from middlebox.clients import BUILTIN_CLIENTS
    from middlebox.run.score import evaluate_expect, score_client

    scenario = load(LIBRARY / "rate-limit-always.yaml")
    tag = "[middlebox rate-limit-always/mine/0]"
    body = json.dumps({"messages": [{"role": "user", "content": f"{tag} hi"}]}).encode()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    legs = [(request + body, b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n")]
    result = {"results": [{"index": 0, "text": "", "error": error, "chunks": [], "attempts": 1}]}
    score = score_client(
        scenario.name, "mine", [tag], result, [], [], [], [], client_traffic=legs * attempts
    )
    expect = scenario.sections["expect"]
    return [
        # every built-in name is a client block, as the suite reads it
        check.passed
        for check in evaluate_expect(expect, "mine", score.metrics, [*BUILTIN_CLIENTS, "mine"])
    ]


def test_rate_limit_always_fails_an_unbounded_retrier_and_passes_one_that_gives_up() -> None:
    assert all(_storm_checks(3, "RateLimitError: Error code: 429"))  # openai: 2 retries
    assert all(_storm_checks(4, "RateLimitError: 429"))  # resilient: 3 retries
    assert not all(_storm_checks(40, "RateLimitError: 429"))  # retries without bound


def test_the_max_tokens_library_scenario_pins_every_client_reporting_length() -> None:
    scenario = load(LIBRARY / "max-tokens-cut.yaml")
    expect = scenario.sections["expect"]
    assert expect["client.length_hidden"] == 0 and expect["client.stop_invented"] == 0
    assert scenario.sections["workload"].max_tokens == 12


@pytest.mark.parametrize(
    ("differences", "code"), [([], 0), (["s/raw: request 0: shown text differs"], 1)]
)
def test_replay_prints_timing_notes_and_fails_only_on_differences(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, differences: list[str], code: int
) -> None:
    import middlebox.run.replay as replay_module

    def rerun(report: Path, report_dir: Path | None) -> replay_module.Replay:
        return replay_module.Replay(SuiteOutcome([], None, []), differences, [TIMING_NOTE])

    monkeypatch.setattr(replay_module, "replay_report", rerun)
    report = tmp_path / "report.json"
    report.write_text("{}")
    done = CliRunner().invoke(main, ["replay", str(report)])
    assert done.exit_code == code, done.output
    assert f"replay: note: {TIMING_NOTE}" in done.output
    assert ("replay: every verdict identical" in done.output) is (code == 0)
