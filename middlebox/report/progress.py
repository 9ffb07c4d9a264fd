"""The progress of a suite on stderr: on a terminal one self-rewriting line while scenarios
run; anywhere else (CI logs, `make run | cat`) one plain line per scenario-client as it
finishes, so a long run is never minutes of silence before the scorecard."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from middlebox.report.diagnosis import diagnose, figures, symptoms
from middlebox.report.scorecard import cell


def finished_line(position: str, scenario: str, result: dict[str, Any]) -> str:
    """One finished scenario-client in a line: verdict, the symptom numbers, diagnosis.

    `result` is one entry of the report document's `results` (a client score's JSON)."""
    verdict, _ = cell(result)
    numbers = figures(symptoms(result))
    return (
        f"{position} {scenario}/{result.get('client')}: {verdict}; ttft {numbers['ttft ms']} ms, "
        f"{numbers['tok/burst']} tok/burst, gap {numbers['gap ms']} ms, attempts "
        f"{numbers['attempts']}, wasted {numbers['wasted']}; {diagnose(result)}"
    )


class Progress:
    """On a TTY: a bar, done/total, failures, what is running. Elsewhere: a line per
    finished scenario-client (or per scenario when the runner gives no results)."""

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
        them (`{**score.to_json(), "passed": ...}`), for the per-client lines."""
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
        return [finished_line(position, scenario, result) for result in results]
