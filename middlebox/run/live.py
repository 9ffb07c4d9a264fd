"""The Python API of a live proxy, in the spirit of toxiproxy-python: faults added, changed
and removed one at a time while traffic flows, undone by context managers, counters and
journals read back, and scenarios built from files, dicts or objects with the same
validation as `middlebox validate`.

    from middlebox.run.live import ControlClient

    control = ControlClient("http://127.0.0.1:9001")        # `middlebox proxy --control`
    with control.fault("cut", after="tokens", count=5):      # removed again on exit
        ...                                                  # streams now get cut
    control.fired()                                          # {"cut": 1}: connections

`ControlClient` speaks the control API of `middlebox.shell.control` over HTTP (or, for the
pytest fixture, calls the same routes in the proxy's own thread: `in_process`); every
refusal raises `ControlError` with the API's status and problems. `start_proxy` starts
`middlebox proxy --control` as a child process (the one launcher, `run.processes`) and
gives its URLs and a client. docs/python-api.md is the walk-through.
"""

from __future__ import annotations

import http.client
import json
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from middlebox.run.background import BackgroundProxy
    from middlebox.run.processes import UpstreamProcess
    from middlebox.scenario.model import Scenario

START_TIMEOUT = 30.0
"""Seconds `start_proxy` waits for the proxy to listen (as run.processes waits for an upstream)."""

STOP_GRACE = 2.0
"""Seconds the proxy lets live streams finish when stopped (`--grace`): within the 5 s a
stopped child gets before SIGKILL, so it always writes its journal."""

CONTROL_TIMEOUT = 10.0
"""Seconds a control request may take (the API bounds its own reads to 10 s)."""

Transport = Callable[[str, str, bytes], tuple[int, bytes]]
"""(method, path with query, body) -> (status, body): how a client reaches the API."""


class ControlError(RuntimeError):
    """The control API refused a request: its status, error and every problem."""

    def __init__(self, status: int, error: str, problems: list[str] | None = None) -> None:
        self.status = status
        self.error = error
        self.problems = list(problems or [])
        detail = "".join(f"\n  {problem}" for problem in self.problems)
        super().__init__(f"{status}: {error}{detail}")


def http_transport(url: str, token: str | None = None) -> Transport:
    """Requests to the control API at `url` (one connection each; stdlib only)."""
    parts = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected the control API's http://HOST:PORT, got {url!r}")
    host, port = parts.hostname, parts.port or 80

    def send(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        connection = http.client.HTTPConnection(host, port, timeout=CONTROL_TIMEOUT)
        try:
            connection.request(method, path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    return send


def in_process(background: BackgroundProxy) -> Transport:
    """The control API's routes called in a `BackgroundProxy`'s own trio thread (its
    state is only touched there): the pytest fixture's proxy has no control port."""
    from middlebox.shell.control import ControlApi

    api = ControlApi(background.proxy)

    def send(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        # A scenario is parsed in this (the caller's) thread, not on the proxy's loop.
        upload = method == "PUT" and path.split("?", 1)[0].rstrip("/") == "/scenario"
        parsed = api.parse_here(body) if upload else None
        response = background._call(lambda: api.route(method, path, {}, body, parsed))
        return response.status, response.body

    return send


class ControlClient:
    """A client of one live proxy's control API (`middlebox.shell.control`)."""

    def __init__(
        self, url: str = "", *, token: str | None = None, transport: Transport | None = None
    ) -> None:
        if transport is None and not url:
            raise ValueError("give the control API's URL (or a transport)")
        self.url = url
        self._send = transport or http_transport(url, token)
        # The faults this client's open blocks hold. The API names a fault only by its
        # index and its name, and neither is stable (an insert before it moves it, a
        # change rewrites its options), so each is kept current by this client's own edits.
        self._held: list[_Held] = []

    # -- plumbing

    def request(self, method: str, path: str, value: Any = None, *, text: str = "") -> Any:
        """One request; the JSON answer (the text for /metrics and journals) or ControlError."""
        body = text.encode() if text else (json.dumps(value).encode() if value is not None else b"")
        status, answer = self._send(method, path, body)
        if status >= 400:
            try:
                problem = json.loads(answer)
            except ValueError:
                raise ControlError(status, answer.decode(errors="replace").strip()) from None
            raise ControlError(status, str(problem.get("error")), problem.get("problems"))
        if path.startswith("/metrics") or path.startswith("/journals/"):
            return answer.decode()
        return json.loads(answer)

    # -- faults, one at a time

    def faults(self) -> list[dict[str, Any]]:
        """The active path: `[{"index", "fault", "options"}, ...]`, options as written."""
        return list(self.request("GET", "/faults")["faults"])

    def add_fault(self, fault: str, at: int | None = None, **options: Any) -> int:
        """Add `fault` with `options` (as a scenario writes them: `delay="300ms"`) at
        position `at` (default: the end, nearest the server); returns its index."""
        answer = self.request("POST", "/faults", {"fault": fault, "options": options, "at": at})
        where, count = int(answer["added"][0]), len(answer["added"])
        for held in self._held:
            if held.index is not None and held.index >= where:
                held.index += count
        return where

    def change_fault(self, fault: int | str, **options: Any) -> dict[str, Any]:
        """Merge `options` into one fault's (by index, or by a name used once); an option
        given as None goes back to its default. Returns the fault as it is now."""
        answer = self.request("PATCH", f"/faults/{_reference(fault)}", options)
        now = dict(answer["faults"][answer["changed"]])
        for held in self._held:
            if held.index == now["index"]:
                held.options = now["options"]
        return now

    def remove_fault(self, fault: int | str) -> dict[str, Any]:
        """Remove one fault (by index or name); returns what it was."""
        gone = dict(self.request("DELETE", f"/faults/{_reference(fault)}")["removed"])
        for held in self._held:
            if held.index is not None and held.index >= gone["index"]:
                held.index = held.index - 1 if held.index > gone["index"] else None
        return gone

    def clear_faults(self) -> None:
        """Remove every fault: the proxy relays byte-exact (its `proxy:` block stays)."""
        self.request("DELETE", "/faults")
        for held in self._held:
            held.index = None

    @contextmanager
    def fault(self, fault: str, at: int | None = None, **options: Any) -> Iterator[int]:
        """`add_fault` for the block: the fault is removed on exit, however it ends, and
        wherever this client's own edits in the block moved or changed it."""
        index = self.add_fault(fault, at, **options)
        with self._holding(self.faults()[index]) as held:
            try:
                yield index
            finally:
                self.remove_fault(self._find(held))

    @contextmanager
    def _holding(self, entry: dict[str, Any]) -> Iterator[_Held]:
        held = _Held(entry["index"], entry["fault"], entry["options"])
        self._held.append(held)
        try:
            yield held
        finally:
            self._held.remove(held)

    def _find(self, held: _Held) -> int:
        """Where `held` is now: at its index if the fault there is it, else (another
        client edited the path) the same fault with the same options nearest to it."""
        now = self.faults()
        if held.index is not None and held.index < len(now) and held.matches(now[held.index]):
            return held.index
        same = [f["index"] for f in now if held.matches(f)]
        if held.index is None or not same:
            raise ControlError(404, f"the {held.fault} fault this block holds is gone")
        near = held.index
        return int(min(same, key=lambda i: abs(i - near)))

    @contextmanager
    def changed(self, fault: int | str, **options: Any) -> Iterator[dict[str, Any]]:
        """`change_fault` for the block: the fault's options are put back on exit."""
        before = self.request("GET", f"/faults/{_reference(fault)}")
        now = self.change_fault(before["index"], **options)
        with self._holding(now) as held:
            try:
                yield now
            finally:
                restore: dict[str, Any] = {name: None for name in held.options}
                restore.update(before["options"])
                self.change_fault(self._find(held), **restore)

    # -- whole scenarios

    def active_scenario(self) -> dict[str, Any]:
        """The active scenario: name, description, seed, path and `document` (a body
        `set_scenario` takes back)."""
        return dict(self.request("GET", "/scenario"))

    def set_scenario(
        self, scenario: str | Path | Scenario | Mapping[str, Any], *, ignore: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """Make `scenario` (a file, a library scenario's name, a dict of the YAML's shape,
        or a `Scenario`) active for new connections, validated by the proxy's loader
        (ControlError with every problem).
        `ignore=("upstream", "workload")` applies a scenario whose blocks a live proxy
        cannot apply (it refuses them otherwise)."""
        query = f"?ignore={','.join(ignore)}" if ignore else ""
        return dict(self.request("PUT", f"/scenario{query}", text=scenario_text(scenario)))

    def clear_scenario(self) -> None:
        """Back to pass-through (no faults, default `proxy:` block)."""
        self.request("DELETE", "/scenario")

    @contextmanager
    def using(
        self, scenario: str | Path | Scenario | Mapping[str, Any], *, ignore: tuple[str, ...] = ()
    ) -> Iterator[dict[str, Any]]:
        """`set_scenario` for the block; the scenario active before comes back on exit."""
        before = self.active_scenario()
        now = self.set_scenario(scenario, ignore=ignore)
        try:
            yield now
        finally:
            if before["name"] == "pass-through" and not before["path"]:
                self.clear_scenario()
            else:
                self.set_scenario(before["document"])

    # -- counters and journals

    def counters(self) -> dict[str, float]:
        """Every sample of `GET /metrics`: `name{labels}` -> value (Prometheus text)."""
        from middlebox.observe.prometheus import parse_text

        return parse_text(self.request("GET", "/metrics"))

    def fired(self) -> dict[str, int]:
        """The faults that took effect: fault name -> connections it fired on."""
        prefix = 'middlebox_fault_connections_total{fault="'
        return {
            name[len(prefix) : -2]: int(value)
            for name, value in self.counters().items()
            if name.startswith(prefix) and value
        }

    def never_fired(self) -> list[str]:
        """The active path's faults that fired on no connection since the counters were
        reset: the live form of a run's proof that each declared fault took effect."""
        fired = self.fired()
        return [f["fault"] for f in self.faults() if f["fault"] not in fired]

    def reset_counters(self) -> None:
        """Zero the counters and forget the journals (between tests)."""
        self.request("POST", "/counters/reset")

    def journals(self) -> list[dict[str, Any]]:
        """One summary per connection journal the proxy holds (the newest 256)."""
        return list(self.request("GET", "/journals")["journals"])

    def journal(self, connection: int) -> list[dict[str, Any]]:
        """One connection's journal: its NDJSON lines as dicts (secrets redacted)."""
        text = self.request("GET", f"/journals/{int(connection)}")
        return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass(eq=False)  # two blocks may hold the same fault (a `changed` inside a `fault`)
class _Held:
    """A fault an open block holds: its index (None once this client removed it) and the
    options it has now."""

    index: int | None
    fault: str
    options: dict[str, Any]

    def matches(self, entry: dict[str, Any]) -> bool:
        return bool(entry["fault"] == self.fault and entry["options"] == self.options)


def _reference(fault: int | str) -> str:
    return urllib.parse.quote(str(fault), safe="")


# ------------------------------------------------------------------ scenarios


def scenario_text(scenario: str | Path | Scenario | Mapping[str, Any]) -> str:
    """The body `PUT /scenario` takes for a file, a library scenario's name (as
    `load_scenario` takes it; `UnknownScenario` with did-you-mean for a name that is
    neither), a dict or a `Scenario` object."""
    from middlebox.library import resolve
    from middlebox.scenario.model import Scenario

    if isinstance(scenario, Scenario):
        from middlebox.shell.fault_edits import scenario_document

        return json.dumps(scenario_document(scenario))
    if isinstance(scenario, Mapping):
        return json.dumps(dict(scenario))
    return resolve(scenario).read_text(encoding="utf-8")


def load_scenario(
    scenario: str | Path | Scenario | Mapping[str, Any], root: Path | None = None
) -> Scenario:
    """A validated `Scenario` from a file (relative to `root` when not found as given),
    a library scenario's name (`"reset-mid-stream"`), a `Scenario`, or a dict of the
    YAML's shape, read by the same loader as a file (raises `ScenarioError` listing every
    problem, with did-you-mean; `UnknownScenario` for a name that is no file and no
    library scenario)."""
    from middlebox import compose
    from middlebox.library import resolve
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
            presets=compose.PRESETS,
        )
    path = Path(scenario)
    if root is not None and not path.exists() and (root / path).exists():
        path = root / path
    return compose.load(resolve(path))


def fault(name: str, **options: Any) -> dict[str, Any]:
    """One path entry for a scenario built in code: `fault("cut", count=5)` is
    `{"cut": {"count": 5}}`, the YAML's own shape."""
    return {name: options}


def scenario(name: str, *faults: Mapping[str, Any], **blocks: Any) -> Scenario:
    """A validated scenario built in code: `scenario("cut", fault("cut", count=5),
    upstream={"itl": "15ms"})`, checked exactly as a file is."""
    return load_scenario({"name": name, **blocks, "path": [dict(f) for f in faults]})


# ------------------------------------------------------------ a proxy process


CONTROL_BANNER = "; control API on "
UI_BANNER = "; console on "


def control_banner(line: str) -> str | None:
    """`middlebox proxy --control`'s readiness line, or None for any other line."""
    return line.strip() if line.startswith("listening on ") and CONTROL_BANNER in line else None


@dataclass
class ProxyProcess:
    """`middlebox proxy --control` running as a child: `.url`, `.base_url`, `.control`."""

    process: UpstreamProcess
    url: str
    control: ControlClient
    ui_url: str | None = None  # the live console's page, with --ui

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_proxy(
    upstream: str,
    *,
    scenario: str | Path | None = None,
    token: str | None = None,
    listen: str = "127.0.0.1:0",
    control: str = "127.0.0.1:0",
    journal: str | Path | None = None,
    grace: float = STOP_GRACE,
    timeout: float = START_TIMEOUT,
    ui: str | None = None,
    drill: str | None = None,
) -> ProxyProcess:
    """`middlebox proxy` in front of `upstream` with its control API (by default both on
    free loopback ports; `journal` is written when it stops); returns once it listens
    (raises UpstreamStartError with the cause it gave)."""
    argv = [sys.executable, "-m", "middlebox", "proxy", "--listen", listen,
            "--upstream", upstream, "--control", control, "--grace", f"{grace:g}"]  # fmt: skip
    if scenario is not None:
        argv += ["--scenario", str(scenario)]
    if token:
        argv += ["--control-token", token]
    if journal is not None:
        argv += ["--journal", str(journal)]
    if ui is not None:  # the live console (docs/ui.md), showing `drill`'s state if given
        argv += ["--ui", ui, *(["--drill", drill] if drill else [])]
    from middlebox.run.processes import UpstreamProcess

    child = UpstreamProcess(argv, control_banner, timeout=timeout, what="the proxy")
    banner = child.url
    proxy_url = banner[len("listening on ") :].split()[0]
    control_url = banner.split(CONTROL_BANNER, 1)[1].split()[0]
    ui_url = banner.split(UI_BANNER, 1)[1].split(";")[0].strip() if UI_BANNER in banner else None
    return ProxyProcess(child, proxy_url, ControlClient(control_url, token=token), ui_url)
