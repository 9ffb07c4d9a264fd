"""Processes for the benchmark: start, find their trees, read CPU and memory, stop by PID.

CPU is read from /proc/PID/task/*/schedstat (nanoseconds on CPU, per thread, so a
multi-threaded or multi-process proxy is counted whole) summed over the process tree;
memory is VmRSS summed over the tree. Both are the method of
shared/reference/performance-anchors.md.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def children_map() -> dict[int, list[int]]:
    """parent pid -> child pids, from /proc/*/stat (the field after the command name)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces; ppid follows it.
        fields = stat[stat.rfind(")") + 2 :].split()
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def process_tree(root: int) -> list[int]:
    tree = children_map()
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(tree.get(pid, []))
    return pids


def cpu_ns(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total


def rss_kib(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


def wait_listening(port: int, deadline_s: float = 30.0) -> None:
    """Poll until 127.0.0.1:port accepts a connection (or raise after `deadline_s`)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > end:
                raise RuntimeError(f"nothing listening on 127.0.0.1:{port}") from None
            time.sleep(0.05)


class Proc:
    """A child process we started; `stop()` ends it (and only it) by PID."""

    def __init__(
        self, argv: Sequence[str], *, cwd: Path | None = None, log: Path | None = None
    ) -> None:
        self.argv = list(argv)
        self.log = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        self.popen = subprocess.Popen(
            self.argv, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tree(self) -> list[int]:
        return process_tree(self.pid)

    def stop(self, sig: int = signal.SIGTERM, wait_s: float = 10.0) -> None:
        """Signal our child, wait; past `wait_s` SIGKILL it and whatever it forked, by PID."""
        if self.popen.poll() is None:
            tree = self.tree()
            self.popen.send_signal(sig)
            try:
                self.popen.wait(wait_s)
            except subprocess.TimeoutExpired:
                for pid in tree:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.popen.wait(5)
        if not isinstance(self.log, int):  # subprocess.DEVNULL is an int
            self.log.close()
