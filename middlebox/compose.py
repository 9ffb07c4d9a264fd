"""The composition root: where the core meets the fault library.

Only this module imports `faults` (tests/test_architecture.py): it turns a scenario's `path:`
into fault instances and its `proxy:` block into the proxy's own nginx stages, so the core,
the shell and the runner stay free of any particular fault.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from faults import REGISTRY
from faults._proxy.client_header_timeout import ClientHeaderTimeout
from faults._proxy.fail_closed import FailClosed
from faults._proxy.fail_closed_response import FailClosedResponse
from faults._proxy.proxy_read_timeout import ProxyReadTimeout
from faults._proxy.request_timeouts import RequestTimeouts
from faults._proxy.upstream_unreachable import UpstreamUnreachable
from faults.presets import PRESET_PROXY
from faults.presets import PRESETS as PRESET_PATHS
from middlebox.core.fault import Fault
from middlebox.library import SUFFIXES, scenario_file
from middlebox.scenario.convert import Problem, ScenarioError
from middlebox.scenario.expect import client_problems
from middlebox.scenario.load import load_scenario, load_scenario_text
from middlebox.scenario.model import ProxyOptions, Scenario
from middlebox.scenario.presets import preset_text
from middlebox.scenario.schema import scenario_json_schema

SCENARIO_SUFFIXES = SUFFIXES

# The presets as the loader reads them: each one's faults with its `proxy:` options.
PRESETS: dict[str, str] = {
    name: preset_text(path, PRESET_PROXY.get(name)) for name, path in PRESET_PATHS.items()
}


def scenario_sections() -> dict[str, type | None]:
    """The optional top-level blocks a scenario may have and the dataclass validating each."""
    from middlebox.scenario.workload import Workload

    sections: dict[str, type | None] = {"upstream": None, "workload": Workload, "expect": None}
    try:
        from vllm_emulator.config import EmulatorConfig

        sections["upstream"] = EmulatorConfig
    except ImportError:  # the emulator's config arrives with the emulator
        pass
    return sections


def registry() -> Mapping[str, type[Fault]]:
    return REGISTRY


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given, the scenario files (sorted) inside directories, and the library's
    file for a name that is no path here (`reset-mid-stream`); a path that is neither
    stays as given, for the loader to say it cannot be read."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            path = scenario_file(str(path)) or path
        if path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if p.suffix in SCENARIO_SUFFIXES))
        else:
            found.append(path)
    return found


def load(path: str | Path) -> Scenario:
    return load_scenario(path, REGISTRY, sections=scenario_sections(), presets=PRESETS)


def load_text(text: str, name: str = "<string>") -> Scenario:
    """A scenario from YAML text, as `load` reads a file: the same faults, sections and
    presets (the control API's PUT /scenario and POST /faults)."""
    return load_scenario_text(
        text, REGISTRY, file=name, sections=scenario_sections(), presets=PRESETS
    )


class NoScenarioFiles(ValueError):
    """Paths that hold no scenario file (an empty folder): checking them would check nothing."""


def validate_paths(
    paths: Iterable[str | Path], clients: Collection[str] = ()
) -> tuple[list[Scenario], list[Problem]]:
    """Load every scenario; return the good ones and every problem found in the rest.

    An `expect:` block for a client none of `clients` names is a warning on its scenario,
    not a problem: a run may bring that client with `--client-cmd NAME=COMMAND`."""
    given = [str(path) for path in paths]
    files = expand_paths(given)
    if not files:
        raise NoScenarioFiles(f"no scenario files in {', '.join(given)}")
    good: list[Scenario] = []
    problems: list[Problem] = []
    for path in files:
        try:
            scenario = load(path)
        except ScenarioError as error:
            problems.extend(error.problems)
            continue
        if clients:
            unknown = client_problems(scenario, clients)
            scenario = dataclasses.replace(scenario, warnings=(*scenario.warnings, *unknown))
        good.append(scenario)
    return good, problems


def json_schema() -> dict[str, Any]:
    return scenario_json_schema(REGISTRY, scenario_sections(), PRESETS)


class NginxStages:
    """The proxy's own behaviour from a scenario's `proxy:` block, as pure stages
    (faults/_proxy); a running proxy takes it as `ProxyConfig(stages=PROXY_STAGES)`."""

    def around(self, options: ProxyOptions) -> tuple[list[Fault], list[Fault]]:
        """The header timeout watches the client's bytes as they arrive, so it goes
        first; the read timeout watches the upstream's, so it goes last."""
        client_side: list[Fault] = []
        upstream_side: list[Fault] = []
        if options.keepalive_timeout is not None or options.client_body_timeout is not None:
            # nginx's timers for every request of a kept-alive connection (the header
            # timeout then times each head, not only the first)
            client_side.append(
                RequestTimeouts(
                    header_timeout=options.client_header_timeout,
                    keepalive_timeout=options.keepalive_timeout,
                    body_timeout=options.client_body_timeout,
                )
            )
        elif options.client_header_timeout is not None:
            client_side.append(ClientHeaderTimeout(timeout=options.client_header_timeout))
        if options.on_unframeable_request == "reject":
            # After the timeouts (which watch every client byte), before every fault.
            client_side.append(FailClosed())
        if options.read_timeout is not None:
            upstream_side.append(ProxyReadTimeout(timeout=options.read_timeout))
        if options.on_unframeable_request == "reject":
            # Server-most, so no fault sees a response nginx would refuse (502 or a close);
            # the same option: a scenario that passes garbage on passes it both ways.
            upstream_side.append(FailClosedResponse())
        return client_side, upstream_side

    def unreachable(self, options: ProxyOptions) -> Fault:
        return UpstreamUnreachable(
            answer=options.on_upstream_unreachable, header_timeout=options.client_header_timeout
        )


PROXY_STAGES = NginxStages()
