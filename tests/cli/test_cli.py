"""The command line: validate, schema, version and help (examples on every command), and
`load --locustfile`, as a user runs them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import click
from click.testing import CliRunner

import middlebox.tools
from faults import REGISTRY
from middlebox import __version__
from middlebox.cli.main import main
from middlebox.library import scenario_dir


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_validate_prints_four_clear_errors_with_lines_and_exits_non_zero(tmp_path: Path) -> None:
    semantic = write(
        tmp_path,
        "incident.yaml",
        (
            "name: incident\n"
            "path:\n"
            "  - latencyy: {delay: 1s}\n"  # misspelled fault
            "  - latency: {delay: 1s, jiter: 1}\n"  # unknown field
            "  - latency: {delay: 5 fortnights}\n"  # bad unit
        ),
    )
    syntax = write(tmp_path, "broken.yaml", "name: broken\npath: [latency\n")  # YAML syntax
    result = CliRunner().invoke(main, ["validate", semantic, syntax])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 4, result.output
    assert f"{semantic}:3:5: path[0]: unknown fault 'latencyy'" in errors[0]
    assert f"{semantic}:4:26: path[1] latency: unknown field 'jiter'" in errors[1]
    assert f"{semantic}:5:22: path[2] latency.delay: expected a duration" in errors[2]
    assert f"{syntax}:3:1: YAML syntax error" in errors[3]


def test_validate_accepts_a_directory_of_good_scenarios(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "name: a\npath:\n  - latency: {delay: 20ms}\n")
    write(tmp_path, "b.yml", "name: b\npath: []\n")
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.count("ok: ") == 2


def test_the_shipped_scenario_library_validates() -> None:
    library = scenario_dir()
    result = CliRunner().invoke(main, ["validate", str(library)])
    assert result.exit_code == 0, result.output
    assert "names no client" not in result.output  # every block names a built-in client


BAD_EXPECT = (
    "name: bad-five\n"
    "path:\n"
    "  - latency: {delay: 100ms}\n"
    "expect:\n"
    "  client.silent_truncation: 0\n"
    "  client.perceived_ttft_ms: {p95max: 500}\n"
    "  nosuchclient: {client.complete: 1}\n"
)


def test_validate_places_every_expect_problem_and_exits_non_zero(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad5.yaml", BAD_EXPECT)
    result = CliRunner().invoke(main, ["validate", bad])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert [error.split(": expect: ")[0] for error in errors] == [
        f"error: {bad}:5:3",
        f"error: {bad}:6:30",
    ]
    assert "ok: " not in result.output


def test_validate_warns_of_a_block_naming_no_built_in_client_where_it_stands(
    tmp_path: Path,
) -> None:
    own = write(tmp_path, "own.yaml", "name: own\npath: []\nexpect:\n  rwa: {client.complete: 1}\n")
    result = CliRunner().invoke(main, ["validate", own])
    assert result.exit_code == 0, result.output  # a run may bring it: --client-cmd rwa=...
    assert f"warning: {own}:4:3: expect: 'rwa' names no client (did you mean 'raw'?)" in (
        result.output
    )


def test_run_places_the_expect_problems_before_starting_anything(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad5.yaml", BAD_EXPECT)
    result = CliRunner().invoke(main, ["run", bad, "--report", str(tmp_path / "report")])
    assert result.exit_code == 1
    assert f"Error: {bad}:5:3: expect: unknown metric 'client.silent_truncation'" in (result.output)
    assert f"{bad}:6:30: expect: client.perceived_ttft_ms: unknown condition 'p95max'" in (
        result.output
    )
    assert not (tmp_path / "report").exists()


def test_validate_of_a_folder_without_scenarios_is_a_usage_error_as_in_run(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.txt").write_text("no scenario here\n")
    for command in ("validate", "run"):
        result = CliRunner().invoke(main, [command, str(tmp_path)])
        assert result.exit_code == 2, (command, result.output)
        errors = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert errors == [f"Error: no scenario files in {tmp_path}"], command


def test_schema_lists_every_registered_fault_with_its_fields() -> None:
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    entries = schema["properties"]["path"]["items"]["anyOf"]
    named = {name for entry in entries for name in entry.get("properties", {})}
    assert named == set(REGISTRY) | {"preset"}
    preset = next(e for e in entries if "preset" in e.get("properties", {}))
    assert "nginx-default" in preset["properties"]["preset"]["anyOf"][0]["enum"]
    latency = next(e for e in entries if "latency" in e.get("properties", {}))
    fields = latency["properties"]["latency"]["anyOf"][0]["properties"]
    assert {"delay", "jitter"} <= set(fields)


def test_version_and_help_on_every_command() -> None:
    runner = CliRunner()
    assert __version__ in runner.invoke(main, ["--version"]).output
    for command in main.commands:
        result = runner.invoke(main, [command, "--help"])
        assert result.exit_code == 0, command
        assert "Usage:" in result.output


def command_lines(group: click.Group, above: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command and subcommand, as the words that name it."""
    for name, command in group.commands.items():
        yield (*above, name)
        if isinstance(command, click.Group):
            yield from command_lines(command, (*above, name))


def test_every_command_and_subcommand_shows_examples_in_its_help() -> None:
    lacking = []
    for words in command_lines(main):
        shown = CliRunner().invoke(main, [*words, "--help"]).output
        # an "Example:" or "Examples:" heading, and under it a line running the command itself
        running = re.escape("middlebox " + " ".join(words))
        example = re.search(rf"^ +Examples?:\n(?: +.*\n)*? +{running}\b", shown, re.M)
        if example is None:
            lacking.append(" ".join(words))
    assert lacking == []
    assert ("drill", "check") in set(command_lines(main))  # subcommands are walked too


def test_load_prints_the_installed_locustfile_without_needing_a_url() -> None:
    result = CliRunner().invoke(main, ["load", "--locustfile"])
    assert result.exit_code == 0, result.output
    path = Path(result.output.strip())
    # beside the imported package, where a wheel installs it: never relative to a checkout
    assert path == Path(middlebox.tools.__file__).parent / "locustfile.py"
    assert path.is_absolute() and path.is_file()
    assert "class" in path.read_text() and "HttpUser" in path.read_text()
