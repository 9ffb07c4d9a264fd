"""The progress line of a suite: one self-rewriting line on stderr while scenarios run."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """Only when the stream is a TTY (CI logs and pipes stay clean): a bar, done/total,
    failures, what is running."""

    def __init__(self, total: int, stream: Any = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.failed = 0
        self.running: list[str] = []

    def update(self, *, started: str = "", finished: str = "", failed: bool = False) -> str:
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
        return line
