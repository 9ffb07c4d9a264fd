"""The Python API's example (docs/python-api.md) runs as a user runs it: it starts the emulator
and `middlebox proxy --control`, adds a cut to the running proxy, streams through it and sees
the stream end early without [DONE], removes it, streams clean, and reads the counters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "live_faults.py"


def test_the_live_faults_example_adds_a_cut_sees_it_removes_it_and_reads_the_counters() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert "[DONE] True" in lines["clean"]
    assert lines["with cut"].strip().startswith("5 tokens, [DONE] False")
    assert "'fault': 'cut'" in lines["added"]
    assert lines["removed"].strip() == "faults now []"
    assert "3 connections, fired {'cut': 1}" in lines["counters"]
    assert "(2, ['cut'])" in lines["journals"]
