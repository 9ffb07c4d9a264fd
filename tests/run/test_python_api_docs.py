"""The Python API and shell completion are documented where a user looks: every public call of
`ControlClient` is in docs/python-api.md, its scenarios-in-code snippet runs as written, the
README names the API, its example and the completion line, and the completion line really
produces a completion script that completes commands and options."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from middlebox.run.live import ControlClient

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
# what the `middlebox` console script runs (pyproject's [project.scripts])
AS_THE_COMMAND = "from middlebox.cli.main import main; main(prog_name='middlebox')"


def test_every_public_call_of_the_control_client_is_documented() -> None:
    calls = [
        name
        for name, member in inspect.getmembers(ControlClient, inspect.isfunction)
        if not name.startswith("_") and name != "request"
    ]
    assert len(calls) >= 15
    missing = [name for name in calls if f"{name}(" not in DOC]
    assert not missing, f"docs/python-api.md does not show {missing}"


def test_the_scenarios_in_code_snippet_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = DOC.split("## Scenarios in code", 1)[1].split("```python\n", 1)[1].split("```")[0]
    namespace: dict[str, object] = {}
    monkeypatch.chdir(tmp_path)  # a library scenario is found by name from anywhere
    exec(compile(block, "docs/python-api.md", "exec"), namespace)
    cut, same = namespace["cut"], namespace["same"]
    assert [s.name for s in cut.path] == [s.name for s in same.path] == ["cut"]  # type: ignore[attr-defined]
    assert namespace["from_library"].name == "reset-mid-stream"  # type: ignore[attr-defined]


def test_the_readme_names_the_api_its_example_and_the_completion_line() -> None:
    api = re.search(r"^## Python API\n(.*?)(?=^## )", README, re.S | re.M)
    assert api, "the README has no '## Python API' section"
    assert "docs/python-api.md" in api.group(1)
    assert "examples/live_faults.py" in api.group(1)
    assert (ROOT / "examples" / "live_faults.py").is_file()
    assert 'eval "$(_MIDDLEBOX_COMPLETE=bash_source middlebox)"' in README


def complete(words: str, environment: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", AS_THE_COMMAND],
        env={**os.environ, **environment, "COMP_WORDS": words,
             "COMP_CWORD": str(len(words.split()) - 1), "_MIDDLEBOX_COMPLETE": "bash_complete"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines() if "," in line]


def test_the_documented_completion_line_produces_a_script_that_completes_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AS_THE_COMMAND],
        env={**os.environ, "_MIDDLEBOX_COMPLETE": "bash_source"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "_middlebox_completion()" in done.stdout
    assert "complete -o nosort -F _middlebox_completion middlebox" in done.stdout
    assert complete("middlebox dr", {}) == ["drill"]
    assert "--port" in complete("middlebox drill start --p", {})
    assert complete("middlebox drill hint sil", {}) == ["silent-truncation"]
