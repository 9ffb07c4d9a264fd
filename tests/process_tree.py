"""Processes as /proc shows them, for the tests that kill a parent and look for what it left
running: its children by PID, whether one is gone, and waiting (bounded) until they are."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(") ", 1)[1].split()


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie waiting for whoever reaps it."""
    fields = _stat(pid)
    return fields is None or fields[0] == "Z"


def child_pids(parent: int) -> set[int]:
    """The live processes whose parent is `parent`."""
    found: set[int] = set()
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[1]) == parent:
                found.add(int(entry.name))
    return found


def command_line(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    """Poll `check` (another process's doing) until it holds or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def survivors(pids: Iterable[int], timeout: float) -> set[int]:
    """Those of `pids` still running after up to `timeout` seconds."""
    pids = set(pids)
    wait_for(lambda: all(gone(pid) for pid in pids), timeout)
    return {pid for pid in pids if not gone(pid)}


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each of `pids` (processes the test started or found as their children)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
