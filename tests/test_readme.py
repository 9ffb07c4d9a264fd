"""The README stays current: every fault, scenario and command is in its tables, the choices
it lists for an option are the option's own, its example client really runs under the client
contract, its pytest plugin example runs a scenario with the fault it tests and passes as
written, every install line names the distribution pyproject.toml builds and every Locust
line the installed locustfile, and the CI section shows the example CI files as they are."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from faults import REGISTRY
from middlebox.cli.main import main
from middlebox.compose import load
from middlebox.library import scenario_dir
from middlebox.scenario.expect import METRICS

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


def choice_lists(text: str, option: str) -> list[list[str]]:
    """The value lists written after `option` in a table row (`--profile a\\|b`: the table's
    escaped bar), each as its values."""
    found = re.findall(rf"{re.escape(option)} ((?:[\w.-]+\\\|)+[\w.-]+)", text)
    return [values.split("\\|") for values in found]


def choice_options(group: click.Group) -> Iterator[tuple[str, set[str]]]:
    """Every option with fixed choices, in every command and subcommand, and its choices."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            yield from choice_options(command)
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, click.Choice):
                yield from ((name, set(map(str, param.type.choices))) for name in param.opts)


def test_every_list_of_choices_in_the_command_table_is_the_commands_own() -> None:
    table = section("Commands")
    checked = []
    for option, choices in choice_options(main):
        for values in choice_lists(table, option):
            assert set(values) == choices, f"README lists {option} {values}; it takes {choices}"
            checked.append(option)
    assert "--profile" in checked  # the emulator's profiles: one list is checked at least


def test_a_list_of_choices_is_read_from_its_table_cell() -> None:
    cell = "`middlebox emulate [--port P --profile vllm-0.33\\|vllm-0.11]` | the emulator |"
    assert choice_lists(cell, "--profile") == [["vllm-0.33", "vllm-0.11"]]
    assert choice_lists(cell, "--port") == []


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


def plugin_examples() -> list[str]:
    """The pytest plugin section's examples, each a project's test file whole."""
    plugin = README.split("### pytest plugin\n", 1)[1].split("\n## ", 1)[0]
    examples = re.findall(r"```python\n(import openai\n.*?)```", plugin, re.S)
    assert len(examples) == 2, "the pytest plugin section shows two whole test files"
    return examples


def plugin_example() -> str:
    """The pytest plugin section's first example (a project's tests/test_streaming.py)."""
    return plugin_examples()[0]


def test_the_plugin_example_asserts_that_its_scenarios_faults_fired() -> None:
    code = plugin_example()
    (name,) = re.findall(r'middlebox_proxy\("([\w-]+)"\)', code)
    scenario = load(scenario_dir() / f"{name}.yaml")
    fired = {spec.name: 1 for spec in scenario.path}
    assert fired, f"{name} has no fault: the example would test nothing"
    assert f'facts["faults_fired"] == {fired!r}'.replace("'", '"') in code


@pytest.mark.e2e
@pytest.mark.parametrize("which", [0, 1], ids=["library-scenario", "fault-mid-test"])
def test_the_plugin_examples_pass_as_written(middlebox_proxy: Any, which: int) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(plugin_examples()[which], "README.md", "exec"), namespace)
    (test,) = [value for name, value in namespace.items() if name.startswith("test_")]
    test(middlebox_proxy)


def pip_installs(text: str) -> list[str]:
    """What each `pip install` or `pipx install` line of a text installs of middlebox."""
    return re.findall(r"pipx? install '?([\w.-]*middlebox[\w.\[\]-]*)", text)


def test_every_install_line_names_the_distribution_pyproject_builds() -> None:
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    texts = {"README.md": README}
    texts |= {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs").glob("*.md")}
    texts |= {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "examples").rglob("*.yml")}
    named = {(where, found) for where, text in texts.items() for found in pip_installs(text)}
    assert ("README.md", name) in named
    wrong = {(where, found) for where, found in named if found.split("[")[0] != name}
    assert not wrong, f"install lines naming another distribution than {name}: {sorted(wrong)}"


def test_an_install_line_naming_another_distribution_is_caught() -> None:
    text = "pip install 'middlebox[redis]'\npipx install llm-middlebox\n`pip install .`"
    assert pip_installs(text) == ["middlebox[redis]", "llm-middlebox"]


def test_locust_is_pointed_at_the_installed_locustfile_not_a_checkouts() -> None:
    texts = {"README.md": README} | {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}
    relative = [where for where, text in texts.items() if "-f middlebox/tools/" in text]
    assert relative == [], "a pip user has no middlebox/tools/: use $(middlebox load --locustfile)"
    assert 'locust -f "$(middlebox load --locustfile)"' in section("Install")


def test_the_ci_section_shows_the_example_ci_files_as_they_are() -> None:
    ci = section("Use it in your CI")
    shown = re.findall(r"```yaml\n(.*?)```", ci, re.S)
    files = [ROOT / "examples" / "ci" / name for name in ("github-actions.yml", "gitlab-ci.yml")]
    assert shown == [path.read_text() for path in files]
    for path in files:
        assert f"]({path.relative_to(ROOT)})" in ci
