"""`run`, `replay` and `drill` as a user meets them: a usage error (an unknown client, a folder
without scenarios, a file that is no report) exits 2 in one line, a scenario that cannot run
exits 1 without the usage text, `run --help` lists every built-in client from the registry,
and drill and client names complete in the shell (click's completion, called in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.shell_completion import ShellComplete
from click.testing import CliRunner

from middlebox.cli.main import main
from middlebox.clients import BUILTIN_CLIENTS
from middlebox.library import drill_dir, scenario_dir

HEALTHY = str(scenario_dir() / "healthy-baseline.yaml")


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


def test_an_unknown_client_is_a_usage_error_that_names_the_built_in_ones() -> None:
    done = CliRunner().invoke(main, ["run", HEALTHY, "--client", "nope"])
    assert done.exit_code == 2, done.output
    (line,) = error_lines(done.output)
    assert "unknown client 'nope'" in line and "browser-eventsource" in line
    assert "Traceback" not in done.output


def test_a_folder_without_scenario_files_is_a_usage_error(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["run", str(tmp_path)])
    assert done.exit_code == 2, done.output
    assert error_lines(done.output) == [f"Error: no scenario files in {tmp_path}"]


def test_a_scenario_that_cannot_run_exits_1_and_is_no_usage_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\npath: [latency\n")
    done = CliRunner().invoke(main, ["run", str(broken), "--client", "raw"])
    assert done.exit_code == 1, done.output
    assert "Usage:" not in done.output
    (line,) = error_lines(done.output)
    assert str(broken) in line


def test_run_help_lists_every_built_in_client_whole() -> None:
    done = CliRunner().invoke(main, ["run", "--help"], terminal_width=80)
    assert done.exit_code == 0, done.output
    listed = done.output.split("Built-in clients (--client NAME):", 1)[1]
    names = [name.strip() for name in listed.replace("\n", " ").split(",")]
    assert names == list(BUILTIN_CLIENTS)
    assert "Default: raw, openai, httpx-sse, resilient;" in " ".join(done.output.split())


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"$schema": "https://json-schema.org/draft/2020-12/schema"}', "without a report's `run`"),
        ('{"a": 1}\n{"b": 2}\n', "not JSON (Extra data: line 2"),
        ("[1, 2]", "without a report's `run`"),
        ('{"run": {"seed": 3}}', "without a report's `run`"),
    ],
)
def test_replaying_a_file_that_is_no_report_is_one_usage_error(
    tmp_path: Path, content: str, says: str
) -> None:
    other = tmp_path / "other.json"
    other.write_text(content)
    done = CliRunner().invoke(main, ["replay", str(other)])
    assert done.exit_code == 2, done.output
    (line,) = error_lines(done.output)
    assert says in line and "the report.json that `middlebox run --report DIR` writes" in line
    assert "Traceback" not in done.output


def test_replaying_a_report_whose_scenario_is_gone_exits_1_naming_it(tmp_path: Path) -> None:
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"run": {"paths": ["scenarios/our-gateway.yaml"]}}))
    done = CliRunner().invoke(main, ["replay", str(report)])
    assert done.exit_code == 1, done.output
    assert "Usage:" not in done.output
    assert error_lines(done.output) == [
        f"Error: {report}: scenario scenarios/our-gateway.yaml not found (looked as written, "
        "beside the report and in the folder above it)"
    ]


def completions(words: list[str], incomplete: str) -> list[str]:
    complete = ShellComplete(main, {}, "middlebox", "_MIDDLEBOX_COMPLETE")
    return [item.value for item in complete.get_completions(words, incomplete)]


@pytest.mark.parametrize("command", ["hint", "start", "check"])
def test_drill_names_complete_from_the_drill_catalogue(command: str) -> None:
    every = sorted(path.stem for path in drill_dir().glob("*.yaml"))
    assert completions(["drill", command], "") == every
    assert completions(["drill", command], "sil") == ["silent-truncation"]
    assert completions(["drill", command], "nothing-like-it") == []


def test_a_drill_hints_number_is_not_completed_as_a_drill_name() -> None:
    assert completions(["drill", "hint", "silent-truncation"], "") == []


def test_client_names_complete_from_the_client_registry() -> None:
    assert completions(["run", "--client"], "browser") == [
        name for name in BUILTIN_CLIENTS if name.startswith("browser")
    ]
    assert "browser-eventsource" in completions(["run", "--client"], "")
