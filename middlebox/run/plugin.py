"""The pytest plugin (entry point `pytest11: middlebox`): a proxy with faults per test.

    def test_my_client_survives_a_cut(middlebox_proxy):
        proxy = middlebox_proxy("healthy-baseline")   # a library scenario, or a file
        with proxy.fault("cut", after="tokens", count=5):   # mid-test, removed on exit
            answer = my_client(base_url=proxy.base_url).ask("hi")
        facts = proxy.score()
        assert facts["faults_fired"] == {"cut": 1}

`middlebox_proxy(scenario)` takes a library scenario's name (`middlebox scenarios` lists
them), a scenario file (relative to the rootdir when not found as given; a file wins over
a name), a `Scenario` (e.g. built with `middlebox.run.live.scenario`), or a dict of the
YAML's shape (`{"name": "cut", "path": [{"cut": {"after": "tokens", "count": 5}}]}`,
validated exactly as a file is: every problem at once, with did-you-mean), starts the
embedded vLLM emulator (its own process, configured by the scenario's `upstream:` block)
unless `upstream=URL` names a real server, and a middlebox proxy in a thread (its own trio
loop) in front of it; both listen on 127.0.0.1 with free ports and keep their journals in
memory, so tests run in parallel under pytest-xdist without sharing a port or a file.
Everything a test started is stopped when it ends.

The proxy it returns is a `middlebox.run.live.ControlClient` of that proxy (the control
API's routes, called in the proxy's thread: no port), so a test changes faults while it
runs: `add_fault`, `change_fault`, `remove_fault`, `with proxy.fault(...)`,
`with proxy.changed(...)`, `faults()`, `fired()`, `counters()`, `journals()`. It also has
the `BackgroundProxy`'s own `.base_url`, `.url`, `.model` (the upstream's first model),
`score()` (journal-derived facts: connections, the faults that fired (by name:
connections), fault actions, how each connection's sides ended, SSE events that reached
the client, journal drops), `ledger()` (the emulator's ledger) and `journal_lines()`.
Importing this module is cheap (pytest loads it in every session); the proxy's
machinery is imported when the fixture is first used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# live imports only the standard library at module level: the plugin stays cheap to load
from middlebox.run.live import ControlClient, Transport, in_process

if TYPE_CHECKING:
    from middlebox.run.background import BackgroundProxy
    from middlebox.scenario.model import Scenario


def scenario_from(scenario: str | Path | Scenario | Mapping[str, Any], root: Path) -> Scenario:
    """A `Scenario` from a file (relative to `root` when not found as given), a library
    scenario's name, a `Scenario`, or a dict of the YAML's shape
    (`middlebox.run.live.load_scenario`)."""
    from middlebox.run.live import load_scenario

    return load_scenario(scenario, root)


def fixture_proxy(background: BackgroundProxy) -> FixtureProxy:
    """A control client of `background` that also answers for it."""
    return FixtureProxy(background, in_process(background))


class FixtureProxy(ControlClient):
    """What `middlebox_proxy(...)` returns: a `ControlClient` of the test's proxy (faults
    changed mid-test) with the `BackgroundProxy`'s own `.base_url`, `.url`, `.model`,
    `score()`, `ledger()`, `journal_lines()` and `write_journal()`."""

    def __init__(self, background: BackgroundProxy, transport: Transport) -> None:
        super().__init__(transport=transport)
        self.background = background
        self.url = background.url

    @property
    def base_url(self) -> str:
        return self.background.base_url

    @property
    def model(self) -> str:
        return self.background.model

    def score(self) -> dict[str, Any]:
        return self.background.score()

    def ledger(self) -> list[dict[str, Any]]:
        return self.background.ledger()

    def journal_lines(self) -> list[dict[str, Any]]:
        return self.background.journal_lines()

    def write_journal(self, path: str | Path) -> Path:
        return self.background.write_journal(path)


@pytest.fixture
def middlebox_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory: `middlebox_proxy(scenario, upstream=None)` → a started proxy: a
    `ControlClient` of it (faults changed mid-test) with the `BackgroundProxy`'s
    `.base_url`, `.model`, `.score()`, `.ledger()`, `.journal_lines()`."""
    started: list[BackgroundProxy] = []

    def start(
        scenario: str | Path | Scenario | Mapping[str, Any], *, upstream: str | None = None
    ) -> Any:
        from middlebox.run.background import start_background

        loaded = scenario_from(scenario, Path(str(request.config.rootpath)))
        directory = tmp_path / f"middlebox-{len(started)}"
        directory.mkdir()
        background = start_background(loaded, directory, upstream)
        started.append(background)
        return fixture_proxy(background)

    yield start
    for background in started:
        background.close()
