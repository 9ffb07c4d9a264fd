"""Where a run's files lie in a report directory, shared by the runner that writes them and
the views that read them back.

    REPORT/report.json  REPORT/junit.xml  REPORT/report.html
    REPORT/runs/NN-SCENARIO/{emulator.log, ledger.json, CLIENT.journal.ndjson, ...}
"""

from __future__ import annotations

from pathlib import Path


def safe_name(name: str) -> str:
    """A file name from a scenario name: no separators, no traversal (`../` stays out)."""
    cleaned = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name).strip("-.")
    return cleaned[:80] or "scenario"


def run_directory(runs: Path, index: int, scenario: str) -> Path:
    """The directory of the `index`th scenario's run under `runs` (REPORT/runs)."""
    return runs / f"{index:02d}-{safe_name(scenario)}"
