"""The package is the product: the wheel, installed into a fresh virtual environment outside
the checkout, serves a user's project with nothing of the source tree around it.

The wheel is built from a copy of what it packages (pyproject.toml, README.md and the three
packages, without node_modules/ or caches), the venv is made in a temporary folder and the
wheel installed with the CI examples' own install line (examples/ci/: the distribution's name
swapped for the wheel's path; its dependencies come from pip's index or cache, as `make`'s
do). Every command then runs in a scratch project holding what README's "Use it in your CI"
says a project holds: README's example client as `my_client.py`, its pytest plugin example as
`tests/test_streaming.py`, and `scenarios/our-gateway.yaml` from examples/ci/. Only the
venv's `bin/` leads PATH, PYTHONPATH is unset and `$XDG_CACHE_HOME` is a folder of the test's,
so nothing can reach the checkout and nothing is written outside the test's folders.

Bounded: one wheel, one venv (per xdist worker), each command under its own timeout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from middlebox.clients.node import node_available
from middlebox.clients.node.launch import SOURCES as NODE_SOURCES
from middlebox.library import catalogue, drill_dir, scenario_names
from tests.harness import needs

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXAMPLES = ROOT / "examples" / "ci"
DISTRIBUTION = "llm-middlebox"
PACKAGED = ("pyproject.toml", "README.md", "middlebox", "faults", "vllm_emulator")
NOT_PACKAGED = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "node_modules", ".npm-install.lock", "*.egg-info", "build"
)


@dataclass
class Installed:
    wheel: Path
    venv: Path
    project: Path
    cache: Path
    env: dict[str, str]

    def sh(self, command: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """`command` as a CI runner's shell runs it, in the scratch project."""
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ok(self, command: str, timeout: float = 180) -> str:
        done = self.sh(command, timeout)
        said = f"{command}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
        assert done.returncode == 0, said
        return done.stdout

    @property
    def package(self) -> Path:
        (site,) = self.venv.glob("lib/python3*/site-packages")
        return site / "middlebox"


def readme_block(opening: str) -> str:
    """The README's ```python block that starts with `opening`."""
    found = re.search(rf"```python\n({re.escape(opening)}.*?)```", README, re.S)
    assert found, f"README has no python block starting {opening!r}"
    return found.group(1)


def ci_commands(name: str) -> list[str]:
    """The shell commands of an example CI file: GitHub's `run:` steps, GitLab's `script:`."""
    document = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    if "jobs" in document:
        return [s["run"] for job in document["jobs"].values() for s in job["steps"] if "run" in s]
    return [line for job in document.values() for line in job["script"]]


def with_the_wheel(command: str, wheel: Path) -> str:
    """The install line with the built wheel in place of the distribution's name on PyPI."""
    if not command.startswith("python -m pip install"):
        return command
    words = command.split()
    assert DISTRIBUTION in words, f"the install line installs no {DISTRIBUTION}: {command}"
    return " ".join(str(wheel) if word == DISTRIBUTION else word for word in words)


def scratch_project(folder: Path) -> None:
    folder.mkdir()
    (folder / "my_client.py").write_text(readme_block("import json, os, time\n"))
    (folder / "tests").mkdir()
    (folder / "tests" / "test_streaming.py").write_text(readme_block("import openai\n"))
    shutil.copytree(EXAMPLES / "scenarios", folder / "scenarios")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    source.mkdir()
    for name in PACKAGED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=NOT_PACKAGED)
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = base / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("llm_middlebox-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    here = Path(sys.executable).parent
    path = [str(venv / "bin")] + [
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != here
    ]
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH")
        and not key.startswith(("MIDDLEBOX_", "PYTEST_"))
    }
    env.update(
        PATH=os.pathsep.join(path),
        VIRTUAL_ENV=str(venv),
        XDG_CACHE_HOME=str(base / "cache"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    project = base / "project"
    scratch_project(project)
    done = Installed(wheel, venv, project, base / "cache", env)
    (install,) = [c for c in ci_commands("github-actions.yml") if c.startswith("python -m pip")]
    done.ok(with_the_wheel(install, wheel), timeout=600)
    yield done


def junit_failures(path: Path) -> list[str]:
    return [failure.get("message", "") for failure in ET.parse(path).getroot().iter("failure")]


def test_the_wheel_holds_the_library_the_drills_and_the_clients_sources(
    installed: Installed,
) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for scenario in scenario_names():
        assert f"middlebox/library/scenarios/{scenario}.yaml" in names
    for drill in drill_dir().glob("*.yaml"):
        assert f"middlebox/library/drills/{drill.name}" in names
    for source in NODE_SOURCES:
        assert f"middlebox/clients/node/{source}" in names
    assert "middlebox/clients/locks/openai-v2.txt" in names
    # `middlebox probe-upstream`, what a user deploys behind an ingress, and its shapes
    assert {"middlebox/tools/probe_upstream.py", "middlebox/scenario/probe_shape.py"} <= names
    assert not [n for n in names if "node_modules" in n or n.startswith(("tests/", "docs/"))]


def test_a_scratch_project_runs_the_library_by_name_and_its_own_scenarios(
    installed: Installed,
) -> None:
    where = installed.ok('python -c "import middlebox; print(middlebox.__file__)"').strip()
    assert Path(where).parent == installed.package  # the venv's copy, never the checkout

    listed = installed.ok("middlebox scenarios").splitlines()
    assert len(listed) == len(scenario_names())
    assert listed == [f"{n:<{max(map(len, scenario_names()))}}  {d}" for n, d in catalogue()]
    assert any(re.match(r"nginx-default-buffering +nginx in front of vLLM", li) for li in listed)

    out = installed.ok(
        "middlebox run nginx-default-buffering --client-cmd 'mine=python my_client.py'"
        " --report by-name"
    )
    assert re.search(r"nginx-default-buffering\s+ok 2/2", out), out
    assert junit_failures(installed.project / "by-name" / "junit.xml") == []

    drills = installed.ok("middlebox drill list")
    assert {line.split()[0] for line in drills.splitlines()} == {
        p.stem for p in drill_dir().glob("*.yaml")
    }


def test_a_failed_check_exits_1_and_is_a_failure_in_junit_xml(installed: Installed) -> None:
    # README's client trusts a clean close: silent truncation, which the scenario forbids
    done = installed.sh(
        "middlebox run clean-close-without-done --client-cmd 'mine=python my_client.py'"
        " --report failed"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "SILENT" in done.stdout
    (failure,) = junit_failures(installed.project / "failed" / "junit.xml")
    assert "client.silent_truncations" in failure
    unknown = installed.sh("middlebox run clean-close-without-dne")
    assert unknown.returncode == 2  # a usage error, not a failed check
    assert "did you mean clean-close-without-done" in unknown.stderr


@pytest.mark.parametrize("example", ["github-actions.yml", "gitlab-ci.yml"])
def test_the_ci_examples_commands_pass_in_a_scratch_project(
    installed: Installed, example: str
) -> None:
    report = installed.project / "middlebox-report"
    shutil.rmtree(report, ignore_errors=True)
    commands = ci_commands(example)
    assert any(c.startswith("python -m pip install") for c in commands)
    for command in commands:
        out = installed.ok(with_the_wheel(command, installed.wheel), timeout=300)
        if command.startswith("middlebox run"):
            for name in ("nginx-default-buffering", "reset-mid-stream", "our-gateway"):
                assert re.search(rf"^{name}\s", out, re.M), out
        if "pytest" in command and "install" not in command:
            assert re.search(r"\b1 passed\b", out), out
    assert junit_failures(report / "junit.xml") == []
    assert junit_failures(report / "pytest.xml") == []
    suites = ET.parse(report / "junit.xml").getroot().iter("testsuite")
    assert {suite.get("name") for suite in suites} == {
        "nginx-default-buffering",
        "reset-mid-stream",
        "our-gateway",
    }


@needs(node_available(), "node (>= 20) and npm")
def test_a_node_client_installs_its_packages_in_the_users_cache(installed: Installed) -> None:
    def files() -> list[Path]:
        found = installed.package.rglob("*")
        return sorted(
            p.relative_to(installed.package) for p in found if "__pycache__" not in str(p)
        )

    before = files()
    out = installed.ok("middlebox run healthy-baseline --client node-openai", timeout=300)
    assert re.search(r"healthy-baseline\s+ok 2/2", out), out
    (stamp,) = installed.cache.glob("middlebox/node/*/node_modules/.middlebox-installed")
    assert (stamp.parents[1] / "openai_sdk.mjs").is_file()  # the driver runs from the cache
    assert files() == before  # nothing written into site-packages
