"""Children die with the process that spawned them (middlebox/shell/lifetime.py): a SIGKILL of
the parent sends each child SIGTERM, and a child forked for a thread that then ends lives on
(the kernel ties the parent-death signal to the forking thread, so every fork happens on one
thread that lives as long as the process). Real processes, bounded waits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest

from middlebox.shell.lifetime import die_with_parent, spawn
from tests.process_tree import gone, kill, survivors, wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
ROOT = Path(__file__).resolve().parents[2]


def parent_that_starts(start: str) -> tuple[subprocess.Popen[str], int]:
    """A Python process that runs `start` (which makes `child`, a Popen) and prints the
    child's pid; returns the parent and that pid."""
    code = f"import subprocess, sys, time\n{start}\nprint(child.pid, flush=True)\ntime.sleep(120)\n"
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), line
    return parent, int(line)


def killed(parent: subprocess.Popen[str]) -> None:
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)


def test_a_sigkilled_parents_spawned_child_stops() -> None:
    parent, child = parent_that_starts(
        "from middlebox.shell.lifetime import spawn\n"
        f"child = spawn({SLEEPER!r})"
    )  # fmt: skip
    try:
        assert not gone(child)
        killed(parent)
        assert survivors([child], timeout=10) == set()
    finally:
        kill([child])


def test_a_plain_popen_child_outlives_a_sigkilled_parent() -> None:
    # what spawn is for: without the parent-death signal the orphan runs on
    parent, child = parent_that_starts(f"child = subprocess.Popen({SLEEPER!r})")
    try:
        killed(parent)
        assert not wait_for(lambda: gone(child), timeout=1.0)
    finally:
        kill([child])
    assert survivors([child], timeout=10) == set()


def test_a_child_spawned_for_a_thread_that_ends_lives_on() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def short_lived() -> None:
        started.append(spawn(SLEEPER))
        # forked by this thread itself: its parent-death signal comes when the thread ends
        started.append(subprocess.Popen(SLEEPER, preexec_fn=partial(die_with_parent, os.getpid())))

    thread = threading.Thread(target=short_lived)
    thread.start()
    thread.join()
    spawned, forked_here = started
    try:
        assert wait_for(lambda: forked_here.poll() is not None, timeout=10)
        assert forked_here.returncode == -signal.SIGTERM
        assert not wait_for(lambda: spawned.poll() is not None, timeout=1.0)
    finally:
        spawned.kill()
        spawned.wait(10)
        forked_here.wait(10)


def test_spawn_runs_the_callers_preexec_and_raises_what_popen_raises() -> None:
    child = spawn(SLEEPER, preexec_fn=os.setsid)
    try:
        assert os.getsid(child.pid) == child.pid
    finally:
        child.kill()
        child.wait(10)
    with pytest.raises(FileNotFoundError):
        spawn(["/nonexistent/middlebox-test-binary"])


def test_a_forked_process_spawns_with_a_spawner_of_its_own() -> None:
    # The spawner thread is not copied by fork: a forked worker starts one afresh.
    code = (
        "import os, signal, sys\n"
        "from middlebox.shell.lifetime import spawn\n"
        "spawn(['true']).wait()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(10)\n"
        "    os._exit(spawn(['true']).wait())\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=30)
    assert done.returncode == 0


def test_the_browser_clients_chromium_stops_when_the_client_is_sigkilled(tmp_path: Path) -> None:
    # a stand-in for Chromium (it is the same fork and exec): a script that becomes a sleeper
    fake = tmp_path / "chromium"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import time; time.sleep(120)'\n")
    fake.chmod(0o755)
    parent, browser = parent_that_starts(
        "from middlebox.clients.browser import start_chromium\n"
        f"child = start_chromium({str(fake)!r}, {str(tmp_path)!r}, 'http://127.0.0.1:9/')"
    )
    try:
        assert not gone(browser)
        killed(parent)
        assert survivors([browser], timeout=10) == set()
    finally:
        kill([browser])
