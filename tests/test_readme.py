"""The README stays current: every fault, scenario and command is in its tables, and its
example client really runs under the client contract."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from faults import REGISTRY
from middlebox.cli.main import main
from middlebox.library import scenario_dir
from middlebox.run.score import METRICS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_every_registered_fault_has_a_row_in_the_fault_table() -> None:
    table = section("Faults")
    missing = [name for name in REGISTRY if f"| `{name}` |" not in table]
    assert not missing, f"faults missing from the README table: {missing}"


def test_every_scenario_file_has_a_row_in_the_scenario_table() -> None:
    table = section("Scenarios")
    missing = [
        p.name
        for p in sorted(scenario_dir().glob("*.yaml"))
        if f"(middlebox/library/scenarios/{p.name})" not in table
    ]
    assert not missing, f"scenarios missing from the README table: {missing}"


def test_every_cli_command_appears_in_the_command_table() -> None:
    table = section("Commands")
    missing = [name for name in main.commands if f"`middlebox {name}" not in table]
    assert not missing, f"commands missing from the README table: {missing}"


def test_every_scoring_name_is_documented() -> None:
    table = section("Scoring")
    missing = [name for name in METRICS if f"| `{name}` |" not in table]
    assert not missing, f"expect: names missing from the README: {missing}"


@pytest.mark.e2e
def test_the_readme_example_client_is_scored_like_a_built_in_one(tmp_path: Path) -> None:
    code = re.search(r"```python\n(import json, os, time\n.*?)```", README, re.S)
    assert code, "the example client is missing from the README"
    client = tmp_path / "my_client.py"
    client.write_text(code.group(1))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "middlebox",
            "run",
            str(scenario_dir() / "healthy-baseline.yaml"),
            "--client-cmd",
            f"mine={sys.executable} {client}",
            "--report",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"healthy-baseline\s+ok 2/2", result.stdout), result.stdout
