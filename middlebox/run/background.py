"""A proxy (and its emulator) running in the background, for synchronous callers: the
pytest plugin and `middlebox drill start`.

`BackgroundProxy` runs a `ControlledProxy` in a thread with its own trio loop; its state
is only touched in that thread (`_call`). `start_background` starts the embedded emulator
first (the one launcher, `middlebox.run.processes`) unless a real upstream is named.
`score()` reads the journals where they are, in memory: no file round trip.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from middlebox.observe.journal import ConnectionJournal, JournalView, facts
from middlebox.run.processes import UPSTREAM_START_TIMEOUT, EmulatorProcess, emulator_config
from middlebox.run.serve import LIBRARY_SCENARIOS, proxy_config
from middlebox.run.upstream import UpstreamClient
from middlebox.scenario.model import Scenario
from middlebox.shell.control import ControlledProxy
from middlebox.shell.server import Address, listen

SETTLE_TIMEOUT = 2.0


def journal_view(journal: ConnectionJournal) -> JournalView:
    """The view `read_ndjson` gives of a written journal, taken from memory (captured bytes
    unredacted: they never leave this process)."""
    view = JournalView(journal.connection_id, opened_at=journal.started_at)
    for line in journal.to_lines():
        view.add(line)
    view.captured = {key: bytes(data) for key, data in journal.captured.items()}
    return view


class BackgroundProxy:
    """A running proxy (and emulator) for one test: `.base_url`, `.score()`, `.close()`."""

    def __init__(self, scenario: Scenario, upstream_url: str, emulator: EmulatorProcess | None):
        self.scenario = scenario
        self.upstream_url = upstream_url
        self.upstream = UpstreamClient(upstream_url)
        self.emulator = emulator
        self.proxy: ControlledProxy = ControlledProxy(
            proxy_config(Address.parse(upstream_url), scenario), loader=LIBRARY_SCENARIOS
        )
        self._port = 0
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="middlebox-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(UPSTREAM_START_TIMEOUT) or self._error is not None:
            raise RuntimeError(f"the middlebox proxy did not start: {self._error!r}")
        self.url = f"http://127.0.0.1:{self._port}"
        self.base_url = f"{self.url}/v1"

    def _run(self) -> None:
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
        assert self._token is not None
        return trio.from_thread.run_sync(function, trio_token=self._token)

    def settle(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Wait (bounded) until no connection is being relayed, so ends are journaled."""
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
        self.settle()

        def views() -> list[JournalView]:
            store = self.proxy.store
            return [journal_view(store.journals[cid]) for cid in sorted(store.journals)]

        summary = facts(self._call(views))
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
        return self.upstream.model()

    def ledger(self) -> list[dict[str, Any]]:
        """The emulator's ledger of generations (empty with a real upstream)."""
        return self.upstream.ledger() if self.emulator is not None else []

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


def start_background(
    scenario: Scenario, directory: Path, upstream: str | None = None
) -> BackgroundProxy:
    """The embedded emulator (configured by the scenario's `upstream:` block, files in
    `directory`) unless `upstream` names a real server, then a `BackgroundProxy` to it."""
    emulator = None
    if upstream is None:
        emulator = EmulatorProcess(emulator_config(scenario, scenario.seed), directory)
        upstream = emulator.url
    try:
        return BackgroundProxy(scenario, upstream, emulator)
    except BaseException:
        if emulator is not None:
            emulator.stop()
        raise
