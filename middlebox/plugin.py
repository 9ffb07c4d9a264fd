"""The pytest plugin (entry point `pytest11: middlebox`): a proxy with faults per test.

    def test_my_client_survives_a_cut(middlebox_proxy):
        proxy = middlebox_proxy("scenarios/mid-stream-rst.yaml")
        answer = my_client(base_url=proxy.base_url).ask("hi")
        facts = proxy.score()
        assert facts["faults_fired"] == {"cut": 1}

`middlebox_proxy(scenario)` takes a scenario file or a `Scenario`, starts the embedded
vLLM emulator (its own process, configured by the scenario's `upstream:` block) unless
`upstream=URL` names a real server, and a middlebox proxy in a thread (its own trio
loop) in front of it; both listen on 127.0.0.1 with free ports and keep their
journals in memory, so tests run in parallel under pytest-xdist without sharing a
port or a file. Everything a test started is stopped when it ends.

`.model` is the upstream's first model. `score()` gives journal-derived facts:
connections, the faults that fired (by name: connections), fault actions, how each
connection's sides ended, SSE events that reached the client, journal drops;
`ledger()` gives the emulator's ledger.
Importing this module is cheap (pytest loads it in every session); the proxy's
machinery is imported when the fixture is first used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from middlebox.control import ControlledProxy
    from middlebox.scenario import Scenario

START_TIMEOUT = 30.0
SETTLE_TIMEOUT = 2.0


class EmulatorProcess:
    """`python -m vllm_emulator` on a free port; stopped by the handle that started it."""

    def __init__(self, config: dict[str, Any], directory: Path) -> None:
        import yaml

        config_file = directory / "emulator.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=True))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vllm_emulator", "--host", "127.0.0.1", "--port", "0",
             "--config", str(config_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        first: list[bytes] = []
        reader = threading.Thread(target=lambda: first.append(self._readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        line = first[0].decode(errors="replace") if first else ""
        if "listening on http://" not in line:
            self.stop()
            raise RuntimeError(f"the emulator did not start: {line!r}")
        self.url = line.split("listening on ", 1)[1].strip()
        # keep reading its log so a chatty emulator never blocks on a full pipe
        threading.Thread(target=self._drain, daemon=True).start()

    def _readline(self) -> bytes:
        assert self.process.stdout is not None
        return self.process.stdout.readline()

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for _ in self.process.stdout:
            pass

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class MiddleboxProxy:
    """A running proxy (and emulator) for one test: `.base_url`, `.score()`, `.close()`."""

    def __init__(self, scenario: Scenario, upstream_url: str, emulator: EmulatorProcess | None):
        import trio

        from middlebox.control import ControlledProxy
        from middlebox.server import Address

        self.scenario = scenario
        self.upstream_url = upstream_url
        self.emulator = emulator
        self.proxy: ControlledProxy = ControlledProxy(Address.parse(upstream_url), scenario)
        self._port = 0
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="middlebox-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT) or self._error is not None:
            raise RuntimeError(f"the middlebox proxy did not start: {self._error!r}")
        self.url = f"http://127.0.0.1:{self._port}"
        self.base_url = f"{self.url}/v1"

    def _run(self) -> None:
        import trio

        from middlebox.server import Address, listen

        async def main() -> None:
            listener = listen(Address("127.0.0.1", 0))
            try:
                async with trio.open_nursery() as nursery:
                    self._cancel = nursery.cancel_scope
                    self._token = trio.lowlevel.current_trio_token()
                    self._port = await nursery.start(self.proxy.serve, listener)
                    self._ready.set()
            finally:
                listener.close()

        try:
            trio.run(main)
        except BaseException as error:  # reported to the test by __init__ or close
            self._error = error
            self._ready.set()

    def _call(self, function: Callable[[], Any]) -> Any:
        """Run `function` in the proxy's trio thread (its state is only touched there)."""
        import trio

        assert self._token is not None
        return trio.from_thread.run_sync(function, trio_token=self._token)

    def settle(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Wait (bounded) until no connection is being relayed, so ends are journaled."""
        import time

        deadline = time.monotonic() + timeout
        while self._call(lambda: self.proxy.active) and time.monotonic() < deadline:
            time.sleep(0.02)

    def journal_lines(self) -> list[dict[str, Any]]:
        def collect() -> list[dict[str, Any]]:
            store = self.proxy.store
            return [
                line for cid in sorted(store.journals) for line in store.journals[cid].to_lines()
            ]

        return list(self._call(collect))

    def write_journal(self, path: str | Path) -> Path:
        target = Path(path)
        target.write_text("".join(json.dumps(line) + "\n" for line in self.journal_lines()))
        return target

    def score(self) -> dict[str, Any]:
        """Journal-derived facts (after the live connections have ended, bounded)."""
        import tempfile

        from middlebox.journal import facts, read_ndjson

        self.settle()
        with tempfile.TemporaryDirectory(prefix="middlebox-score-") as scratch:
            views = read_ndjson(self.write_journal(Path(scratch) / "journal.ndjson"))
        summary = facts(views)
        summary["scenario"] = self.scenario.name
        summary["faults_declared"] = [spec.name for spec in self.scenario.path]
        summary["faults_never_fired"] = [
            name for name in summary["faults_declared"] if name not in summary["faults_fired"]
        ]
        return summary

    @property
    def model(self) -> str:
        """The first model the upstream lists (`GET /v1/models`, asked of the upstream
        directly so the question is not a connection in the journal)."""
        with urllib.request.urlopen(f"{self.upstream_url}/v1/models", timeout=10) as response:
            return str(json.loads(response.read())["data"][0]["id"])

    def ledger(self) -> list[dict[str, Any]]:
        """The emulator's ledger of generations (empty with a real upstream)."""
        if self.emulator is None:
            return []
        with urllib.request.urlopen(f"{self.upstream_url}/emulator/requests", timeout=10) as r:
            return list(json.loads(r.read())["requests"])

    def close(self) -> None:
        if self._token is not None and self._cancel is not None and self._thread.is_alive():
            cancel = self._cancel
            try:
                self._call(cancel.cancel)
            except RuntimeError:  # the loop already ended
                pass
        self._thread.join(10)
        if self.emulator is not None:
            self.emulator.stop()


def _load(scenario: str | Path | Scenario, root: Path) -> Scenario:
    from middlebox.compose import load
    from middlebox.scenario import Scenario

    if isinstance(scenario, Scenario):
        return scenario
    path = Path(scenario)
    if not path.exists() and (root / path).exists():
        path = root / path
    return load(path)


@pytest.fixture
def middlebox_proxy(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., MiddleboxProxy]]:
    """Factory: `middlebox_proxy(scenario, upstream=None)` → a started `MiddleboxProxy`."""
    started: list[MiddleboxProxy] = []

    def start(scenario: str | Path | Scenario, *, upstream: str | None = None) -> MiddleboxProxy:
        from middlebox.runner import emulator_config

        loaded = _load(scenario, Path(str(request.config.rootpath)))
        emulator = None
        if upstream is None:
            directory = tmp_path / f"middlebox-{len(started)}"
            directory.mkdir()
            emulator = EmulatorProcess(emulator_config(loaded, loaded.seed), directory)
            upstream = emulator.url
        try:
            proxy = MiddleboxProxy(loaded, upstream, emulator)
        except BaseException:
            if emulator is not None:
                emulator.stop()
            raise
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.close()
