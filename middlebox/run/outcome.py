"""What a run produced, as plain data: per scenario its client scores, problems and fault
proof; per suite its outcomes; and `report_document`, the JSON every view renders.

The views in `middlebox.report` take the document, never these classes, so reporting
depends on no part of running.
"""

from __future__ import annotations

import platform
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from middlebox import __version__
from middlebox.run.score import ClientScore
from middlebox.scenario.model import Scenario


class RunError(Exception):
    """A run could not start (bad scenario, upstream down); the message says why."""


class UsageError(RunError):
    """A run asked for something that is not there (an unknown client, a folder without
    scenarios, a file that is no report): the caller's mistake, not the run's."""


class Interrupted(RunError):
    """SIGINT or SIGTERM stopped the run; every process it started has been stopped."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = signum


@dataclass
class ScenarioOutcome:
    scenario: Scenario
    seed: int
    scores: list[ClientScore] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    proof: dict[str, Any] = field(default_factory=dict)
    # why the scenario was not run against a real server (`--upstream`): it asks for
    # behaviour only the emulator has; such a scenario neither passes nor fails
    needs_emulator: str | None = None
    # why the scenario was not run against a real server: its stream does not fit the
    # server's context, with the --max-model-len it needs (middlebox.run.context_plan)
    needs_context: str | None = None
    # against a real server: its measured speed and the workload's max_tokens sized to
    # last as long as the scenario's timing models (middlebox.run.suite.paced)
    paced: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems and all(score.passed for score in self.scores)


@dataclass
class SuiteOutcome:
    outcomes: list[ScenarioOutcome]
    seed: int | None
    clients: list[str]
    report_dir: Path | None = None
    # how the suite was asked for (files, clients, upstream, jobs): what a rerun needs
    argv: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(outcome.passed for outcome in self.outcomes)

    def document(self) -> dict[str, Any]:
        """The plain-data report (`report.json`) every view renders."""
        return report_document(self, self.argv)


def status(outcome: ScenarioOutcome) -> str:
    """What the scorecard shows instead of verdicts when the scenario did not run."""
    if outcome.needs_emulator:
        return "needs the emulator"
    return "needs a larger context" if outcome.needs_context else "ran"


def report_document(suite: SuiteOutcome, argv: dict[str, Any]) -> dict[str, Any]:
    """`report.json`: the verdicts and what a rerun needs (files, seeds, clients)."""
    return {
        "middlebox": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "run": {**argv, "seed": suite.seed},
        "passed": suite.passed,
        # every client a scenario ran: those asked for, then those a scenario's workload
        # names (the agent clients): the scorecard's columns
        "clients": list(
            dict.fromkeys([*suite.clients, *(s.client for o in suite.outcomes for s in o.scores)])
        ),
        "scenarios": [
            {
                "name": outcome.scenario.name,
                "file": outcome.scenario.source,
                # what the scenario is about and its expect: hints: the scorecard's "why"
                # and "fix" next to a failed check (middlebox.report.diagnosis)
                "description": outcome.scenario.description,
                "hints": dict(outcome.scenario.sections.get("expect_hints") or {}),
                "seed": outcome.seed,
                "quiet_faults": list(outcome.scenario.quiet_faults),
                "problems": outcome.problems,
                "proof": outcome.proof,
                "needs_emulator": outcome.needs_emulator,
                "needs_context": outcome.needs_context,
                # what the scorecard shows instead of verdicts (report/scorecard.status_of)
                "status": status(outcome),
                "paced": outcome.paced,
                "results": [
                    {**score.to_json(), "passed": score.passed} for score in outcome.scores
                ],
            }
            for outcome in suite.outcomes
        ],
    }
