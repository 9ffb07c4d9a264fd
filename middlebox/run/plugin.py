"""The pytest plugin (entry point `pytest11: middlebox`): a proxy with faults per test.

    def test_my_client_survives_a_cut(middlebox_proxy):
        proxy = middlebox_proxy("scenarios/mid-stream-rst.yaml")
        answer = my_client(base_url=proxy.base_url).ask("hi")
        facts = proxy.score()
        assert facts["faults_fired"] == {"cut": 1}

`middlebox_proxy(scenario)` takes a scenario file, a `Scenario`, or a dict of the YAML's
shape (`{"name": "cut", "path": [{"cut": {"after": "tokens", "count": 5}}]}`, validated
exactly as a file is: every problem at once, with did-you-mean), starts the embedded
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

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from middlebox.run.background import BackgroundProxy
    from middlebox.scenario.model import Scenario


def scenario_from(scenario: str | Path | Scenario | Mapping[str, Any], root: Path) -> Scenario:
    """A `Scenario` from a file (relative to `root` when not found as given), a
    `Scenario`, or a dict of the YAML's shape, validated by the same loader as a file
    (raises `ScenarioError` listing every problem)."""
    from middlebox import compose
    from middlebox.scenario.load import load_scenario_text
    from middlebox.scenario.model import Scenario

    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, Mapping):
        import yaml

        text = yaml.safe_dump(dict(scenario), sort_keys=False, allow_unicode=True)
        return load_scenario_text(
            text,
            compose.registry(),
            file="<dict>",
            sections=compose.scenario_sections(),
            # compose imports PRESETS without re-exporting it; a compose.load_text (the
            # composition root's to add) would make this a plain call
            presets=compose.PRESETS,  # type: ignore[attr-defined]
        )
    path = Path(scenario)
    if not path.exists() and (root / path).exists():
        path = root / path
    return compose.load(path)


@pytest.fixture
def middlebox_proxy(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., BackgroundProxy]]:
    """Factory: `middlebox_proxy(scenario, upstream=None)` → a started `BackgroundProxy`
    (`middlebox.run.background`): `.base_url`, `.model`, `.score()`, `.ledger()`,
    `.journal_lines()`."""
    started: list[BackgroundProxy] = []

    def start(
        scenario: str | Path | Scenario | Mapping[str, Any], *, upstream: str | None = None
    ) -> BackgroundProxy:
        from middlebox.run.background import start_background

        loaded = scenario_from(scenario, Path(str(request.config.rootpath)))
        directory = tmp_path / f"middlebox-{len(started)}"
        directory.mkdir()
        proxy = start_background(loaded, directory, upstream)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.close()
