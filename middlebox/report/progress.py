"""The progress of a suite on stderr: on a terminal one self-rewriting line while scenarios
run; anywhere else (CI logs, `make run | cat`) one plain line per scenario as it finishes,
with each client's verdict, so a long run is never minutes of silence before the scorecard.
The numbers and the diagnosis of each run are the scorecard's symptom table, said once."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from middlebox.report.scorecard import WIDTH, cell, fit


def finished_line(position: str, scenario: str, results: Sequence[dict[str, Any]]) -> list[str]:
    """One finished scenario: each client's verdict cell as the scorecard's matrix shows
    it, in lines of at most WIDTH columns.

    `results` are entries of the report document's `results` (client scores' JSON)."""
    verdicts = ", ".join(f"{result.get('client')} {cell(result)[0]}" for result in results)
    return fit(f"{position} {scenario}: {verdicts}", width=WIDTH)


class Progress:
    """On a TTY: a bar, done/total, failures, what is running. Elsewhere: a line per
    finished scenario with its clients' verdicts (FAIL or ok when the runner gives none)."""

    def __init__(self, total: int, stream: Any = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.failed = 0
        self.running: list[str] = []

    def update(
        self,
        *,
        started: str = "",
        finished: str = "",
        failed: bool = False,
        results: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """`results`: the finished scenario's client results as the report document holds
        them (`{**score.to_json(), "passed": ...}`), for the clients' verdicts."""
        if started:
            self.running.append(started)
        if finished:
            self.done += 1
            self.failed += failed
            if finished in self.running:
                self.running.remove(finished)
        filled = round(20 * self.done / max(self.total, 1))
        line = (
            f"[{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} scenarios"
            f"{f', {self.failed} failed' if self.failed else ''}"
            f"{'; running ' + ', '.join(self.running) if self.running else ''}"
        )[:120]
        if self.enabled:
            end = "\n" if self.done == self.total and not self.running else ""
            self.stream.write("\r\033[K" + line + end)
            self.stream.flush()
        elif finished:
            self.stream.write("\n".join(self.plain_lines(finished, failed, results)) + "\n")
            self.stream.flush()
        return line

    def plain_lines(
        self, scenario: str, failed: bool, results: Sequence[dict[str, Any]] | None
    ) -> list[str]:
        position = f"[{self.done}/{self.total}]"
        if not results:
            return [f"{position} {scenario}: {'FAIL' if failed else 'ok'}"]
        return finished_line(position, scenario, results)
