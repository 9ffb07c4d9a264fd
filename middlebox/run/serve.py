"""`middlebox proxy`: serve the proxy (optionally N workers, or with the control API) until
SIGTERM or SIGINT, then write the journal if asked.

`ProxySettings` is the command line's options, typed once; `ProxySettings.proxy_config` maps
them to the proxy's `ProxyConfig`, through `proxy_config`, the one way every running proxy
(this command's, a client run's, the background proxy's, the recorder's, the soak's) is
wired; `serve` runs it in one process, with the control API, or as workers. Problems in the
settings raise `SettingsError` before anything listens (`OptionConflict` for options that do
not go together), so the command line can show them as its own errors.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from middlebox.compose import PRESETS, PROXY_STAGES, SCENARIO_SUFFIXES, load
from middlebox.compose import load_text as load_scenario_text_with_presets
from middlebox.console.server import Console, check_ui_access, run_console_proxy
from middlebox.core.scenario_state import SharedState
from middlebox.observe.journal import (
    DEFAULT_REDACTION,
    MAX_JOURNAL_BYTES,
    JournalKeeper,
    JournalStore,
    JournalWriter,
    Redaction,
)
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.model import Scenario, TlsOptions
from middlebox.shell.control import ControlledProxy, check_control_access, run_controlled_proxy
from middlebox.shell.server import (
    Address,
    ProxyConfig,
    ProxyServer,
    ProxyStages,
    listening_as,
    relay_clock_offset,
    run_proxy,
)
from middlebox.shell.state import HostClock, open_backend, scoped
from middlebox.shell.tls import LocalCA
from middlebox.shell.workers import WorkersControl, run_workers


class LibraryScenarios:
    """Scenarios read with the fault library (the control API's `ScenarioLoader`)."""

    suffixes: tuple[str, ...] = SCENARIO_SUFFIXES

    def file(self, path: Path) -> Scenario:
        return load(path)

    def text(self, text: str, name: str = "<control>") -> Scenario:
        return load_scenario_text_with_presets(text, name)


LIBRARY_SCENARIOS = LibraryScenarios()
load_text = LIBRARY_SCENARIOS.text


def proxy_config(
    upstream: Address,
    scenario: Scenario,
    *,
    journal: JournalKeeper | None = None,
    stages: ProxyStages | None = PROXY_STAGES,
    max_connections: int | None = None,
    tls: TlsOptions | None = None,
    upstream_insecure: bool = False,
    upstream_ca: str | None = None,
    shared_state: Callable[[str], SharedState] | None = None,
) -> ProxyConfig:
    """A running proxy's config: `scenario` toward `upstream`, every connection journaled in
    `journal` (an on-disk one is also told each connection's end and ticked, so it writes
    as the proxy goes), with the proxy's own nginx stages unless `stages` is None (a bare
    relay, as the recorder wants)."""
    writer = journal if isinstance(journal, JournalWriter) else None
    return ProxyConfig(
        upstream,
        scenario,
        stages=stages,
        observer_factory=(
            (lambda cid, s: journal.observer(cid, time.time(), s.name, relay_clock_offset()))
            if journal is not None
            else None
        ),
        report_sink_factory=journal.fault_sink if journal is not None else None,
        connection_ended=writer.connection_ended if writer is not None else None,
        tick=writer.tick if writer is not None else None,
        max_connections=max_connections,
        tls=tls,
        upstream_insecure=upstream_insecure,
        upstream_ca=upstream_ca,
        shared_state=shared_state,
    )


class SettingsError(ValueError):
    """A scenario or address in the settings that does not load."""


class OptionConflict(SettingsError):
    """Options that do not go together (a usage error)."""


@dataclass(frozen=True)
class ProxySettings:
    listen: str = "127.0.0.1:9000"
    upstream: str = ""
    scenario_file: str | None = None
    grace: float = 10.0
    max_connections: int | None = None
    backlog: int = 1024
    journal_file: str | None = None
    journal_secrets: bool = False
    journal_max_bytes: int = MAX_JOURNAL_BYTES
    # Header, query parameter and JSON field names redacted besides the built-in rule
    # (observe.journal.Redaction), in the journal and the control API alike.
    redact_names: tuple[str, ...] = ()
    workers: int = 1
    # the control API (middlebox.shell.control)
    control: str | None = None
    control_token: str | None = None
    allow_scenario_header: bool = False
    scenario_dir: str | None = None
    # the live web console (middlebox.console, docs/ui.md), behind the control token
    ui: str | None = None
    # TLS (docs/tls-http2.md): --tls toward clients with the local CA in ca_dir;
    # an https:// upstream verified against the system store plus upstream_ca, or not at all.
    tls: bool = False
    ca_dir: str | None = None
    upstream_insecure: bool = False
    upstream_ca: str | None = None
    # Where cross-connection fault state lives (middlebox.shell.state): None keeps it in
    # the process (shared memory among --workers); redis://HOST:PORT/DB shares it with
    # every proxy pointed at that Redis.
    state: str | None = None

    def shared_state(self) -> Callable[[str], SharedState] | None:
        """--state's store, or None to keep the state in the process."""
        if self.state is None:
            return None
        try:
            return scoped(open_backend(self.state))
        except (ValueError, RuntimeError, OSError) as error:
            raise SettingsError(f"--state: {error}") from error

    def clock(self) -> dict[str, Any]:
        """trio.run's clock keyword: with --state, times agree across this host's proxies."""
        return {"clock": HostClock()} if self.state is not None else {}

    def tls_options(self, listen: Address) -> TlsOptions | None:
        """--tls as the server's TLS block: the default names plus the listen host."""
        if not self.tls:
            return None
        hosts = TlsOptions().hostnames
        extra = (
            () if listen.host in hosts or listen.host in ("", "0.0.0.0", "::") else (listen.host,)
        )
        return TlsOptions(hostnames=(*hosts, *extra), ca_dir=self.ca_dir)

    def proxy_config(self, what: Loaded, journal: JournalKeeper | None = None) -> ProxyConfig:
        """The options as the proxy's config (the one place they map to it), journaling in
        `journal`; every way of serving (one process, control API, workers) takes it."""
        return proxy_config(
            what.upstream,
            what.scenario,
            journal=journal,
            max_connections=self.max_connections,
            tls=self.tls_options(what.listen),
            upstream_insecure=self.upstream_insecure,
            upstream_ca=self.upstream_ca,
            shared_state=self.shared_state(),
        )

    @property
    def redaction(self) -> Redaction:
        return DEFAULT_REDACTION.with_names(*self.redact_names)

    def check(self) -> None:
        if self.control is None and self.allow_scenario_header:
            raise OptionConflict("--allow-scenario-header needs --control")
        if self.control is None and self.ui is None and self.control_token:
            raise OptionConflict("--control-token needs --control or --ui")
        if self.ui is not None and self.workers > 1:
            # Each worker holds its own connections; the console shows one process's.
            raise OptionConflict(
                "--ui shows one proxy process's connections and cannot show --workers' "
                "(each worker holds its own): drop --workers, or use --control's summed /metrics"
            )
        if self.control is not None and self.workers > 1 and self.allow_scenario_header:
            # With workers the control API serves the summed /metrics only (shell/workers.py).
            raise OptionConflict("--allow-scenario-header needs one process; drop --workers")
        if self.allow_scenario_header and not self.scenario_dir:
            raise OptionConflict("--allow-scenario-header needs --scenario-dir")


@dataclass(frozen=True)
class Loaded:
    scenario: Scenario
    listen: Address
    upstream: Address
    control: Address | None
    ui: Address | None = None


def loaded(settings: ProxySettings) -> Loaded:
    """The scenario and addresses of `settings`, or a SettingsError saying what is wrong."""
    settings.check()
    try:
        scenario = (
            load(settings.scenario_file)
            if settings.scenario_file
            else Scenario(name="pass-through")
        )
        control = Address.parse(settings.control) if settings.control else None
        if control is not None:
            check_control_access(control, settings.control_token)
        ui = Address.parse(settings.ui) if settings.ui else None
        if ui is not None:
            check_ui_access(ui, settings.control_token)
        return Loaded(
            scenario, Address.parse(settings.listen), Address.parse(settings.upstream), control, ui
        )
    except (ScenarioError, ValueError) as error:
        raise SettingsError(str(error)) from None


def banner(what: Loaded, port: int, tls: TlsOptions | None = None) -> str:
    """The proxy's readiness line (`listening on http://HOST:PORT -> ...`), first on stdout;
    with TLS it is https:// and names the CA file clients trust."""
    tls = tls or what.scenario.proxy.tls
    if tls is not None:
        ca = LocalCA.load_or_create(tls.ca_dir)
        return (
            f"listening on https://{what.listen.host}:{port} -> {what.upstream} "
            f"(scenario {what.scenario.name!r}, {len(what.scenario.path)} faults; "
            f"TLS CA: {ca.cert_path}, trust it with curl --cacert {ca.cert_path})"
        )
    return (
        f"listening on http://{what.listen.host}:{port} -> {what.upstream} "
        f"(scenario {what.scenario.name!r}, {len(what.scenario.path)} faults)"
    )


def serve(
    settings: ProxySettings,
    say: Callable[[str], None],
    drill: Callable[[], dict[str, Any] | None] | None = None,
) -> str:
    """Serve until a signal; `say` gets each line to show (flushed by the caller). Returns
    the closing summary. `drill`: the training drill's state the console shows
    (`middlebox.run.drills.console_state`)."""
    what = loaded(settings)
    if (what.control is not None or what.ui is not None) and settings.workers == 1:
        return _serve_controlled(settings, what, what.control, say, drill)
    journal = _journal_writer(settings)
    config = settings.proxy_config(what, journal)
    if settings.workers > 1:
        control = _workers_control(what.control, settings.control_token)

        def workers_ready(port: int, pids: list[int]) -> None:
            if control is None:
                say(banner(what, port, config.tls))
            else:
                host, control_port = control.listener.getsockname()[:2]
                say(
                    f"{banner(what, port, config.tls)}; control API on http://{host}:{control_port}"
                )
            say(f"workers: {' '.join(map(str, pids))}")

        def finish(index: int, _server: ProxyServer) -> None:
            if journal is not None:  # this worker's copy, forked with it
                journal.close()

        result = run_workers(
            what.listen,
            config,
            settings.workers,
            ready=workers_ready,
            grace=settings.grace,
            backlog=settings.backlog,
            finish=finish,
            control=control,
        )
        return f"stopped: {result.summary()}"
    server = ProxyServer(config)
    try:
        trio.run(
            lambda: run_proxy(
                what.listen,
                server,
                ready=lambda port: say(banner(what, port, config.tls)),
                grace=settings.grace,
                backlog=settings.backlog,
            ),
            **settings.clock(),
        )
    except KeyboardInterrupt:  # a signal before the handlers were installed
        pass
    finally:
        if journal is not None:
            journal.close()
    return (
        f"stopped: {server.connections_accepted} connections, "
        f"{server.connections_refused} refused, {server.reset_at_shutdown} reset at shutdown"
    )


def ui_url(address: Address, port: int) -> str:
    """The console's address to open (a wildcard bind is opened on loopback)."""
    host = address.host
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/"


def _journal_writer(settings: ProxySettings) -> JournalWriter | None:
    """`--journal FILE`: written as the proxy goes (one `FILE.wN` per worker)."""
    if not settings.journal_file:
        return None
    file, workers = settings.journal_file, settings.workers

    def path_for(connection_id: int) -> Path:
        # Worker i numbers its connections i+1, i+1+n, ... (shell/workers.py).
        return Path(f"{file}.w{(connection_id - 1) % workers}") if workers > 1 else Path(file)

    return JournalWriter(
        path_for,
        redact_secrets=not settings.journal_secrets,
        redaction=settings.redaction,
        max_bytes=settings.journal_max_bytes,
    )


def _workers_control(address: Address | None, token: str | None) -> WorkersControl | None:
    """The supervisor's control listener for --workers (GET /metrics summed), if asked."""
    if address is None:
        return None
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with listening_as("control", address):
        listener = socket.create_server((address.host, address.port), family=family)
    listener.setblocking(False)
    return WorkersControl(listener, token=token)


def _serve_controlled(
    settings: ProxySettings,
    what: Loaded,
    control: Address | None,
    say: Callable[[str], None],
    drill: Callable[[], dict[str, Any] | None] | None = None,
) -> str:
    proxy = ControlledProxy(
        settings.proxy_config(what),
        scenario_dir=Path(settings.scenario_dir) if settings.scenario_dir else None,
        allow_scenario_header=settings.allow_scenario_header,
        loader=LIBRARY_SCENARIOS,
        # the control API's default store (latest 256 connections), with the redaction asked
        store=JournalStore(
            capture=True,
            max_connections=256,
            max_capture_bytes=256 * 1024,
            redaction=settings.redaction,
        ),
    )

    def ready(port: int, control_port: int) -> None:
        assert control is not None
        say(
            f"{banner(what, port, proxy.config.tls)}; control API on http://{control.host}:{control_port}"
        )

    def console_ready(port: int, ui_port: int, control_port: int | None) -> None:
        assert what.ui is not None
        line = f"{banner(what, port, proxy.config.tls)}; console on {ui_url(what.ui, ui_port)}"
        if control is not None:
            line += f"; control API on http://{control.host}:{control_port}"
        say(line)

    try:
        ui = what.ui
        if ui is not None:
            console = Console(
                proxy,
                settings.control_token,
                presets=tuple(sorted(PRESETS)),
                drill=drill or (lambda: None),
            )
            trio.run(
                lambda: run_console_proxy(
                    console,
                    what.listen,
                    ui,
                    control_address=control,
                    ready=console_ready,
                    grace=settings.grace,
                    backlog=settings.backlog,
                ),
                **settings.clock(),
            )
        else:
            assert control is not None
            trio.run(
                lambda: run_controlled_proxy(
                    proxy,
                    what.listen,
                    control,
                    token=settings.control_token,
                    ready=ready,
                    grace=settings.grace,
                    backlog=settings.backlog,
                ),
                **settings.clock(),
            )
    except KeyboardInterrupt:
        pass
    finally:
        if settings.journal_file:
            proxy.store.write_ndjson(
                Path(settings.journal_file), redact_secrets=not settings.journal_secrets
            )
    return f"stopped: {proxy.connections_accepted} connections"
