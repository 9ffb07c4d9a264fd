"""Live counters of a running proxy, rendered as Prometheus text (`GET /metrics`).

`CountingObserver` sits between the relay and the journal and adds each chunk's size
to a per-(leg, direction) counter: an integer add on the hot path, nothing more.
Fault reports are counted by fault and action through the report sink. Connection
counts come from the server's `ServerCounters`, which the shell increments by attribute
(typed: a misspelt counter is mypy's error, not a silent new attribute); a reset keeps a
baseline instead of zeroing them, because the server uses its accept counter as the
connection id.

The exposition format is Prometheus' text format 0.0.4: `# HELP` and `# TYPE` lines,
then `name{label="value"} number`, label values escaped (backslash, quote, newline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from middlebox.core.fault import FaultReport, StageEvent
from middlebox.core.stream import Direction
from middlebox.observe.journal import JournalStore
from middlebox.observe.observer import RelayObserver

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class ServerCounters:
    """What a proxy server counts, by attribute. A `ProxyServer` is one (its counters are
    its own attributes, outside its constructor: `init=False`)."""

    connections_accepted: int = field(default=0, init=False)
    connections_failed: int = field(default=0, init=False)
    connections_refused: int = field(default=0, init=False)
    accept_errors: int = field(default=0, init=False)
    tls_handshake_failures: int = field(default=0, init=False)
    # The proxy's own stages (`StageEvent`, counted by `count_stage`).
    header_timeouts: int = field(default=0, init=False)
    read_timeouts: int = field(default=0, init=False)
    unframeable_requests: int = field(default=0, init=False)
    unframeable_responses: int = field(default=0, init=False)
    # HTTP/2 protections (shell/h2_streams.py): connections ended with GOAWAY
    # ENHANCE_YOUR_CALM past their reset budget (rapid reset), and streams the client reset
    # before their upstream connection was dialled (never dialled).
    h2_reset_floods: int = field(default=0, init=False)
    h2_streams_reset_before_dial: int = field(default=0, init=False)
    reset_at_shutdown: int = field(default=0, init=False)
    closed_idle_at_shutdown: int = field(default=0, init=False)  # idle kept-alive, FIN'd
    active: int = field(default=0, init=False)  # a gauge: connections being relayed now

    def count_stage(self, event: StageEvent) -> None:
        """One of the proxy's own stages acted (`StageEvent`)."""
        if event is StageEvent.HEADER_TIMEOUT or event is StageEvent.REQUEST_TIMEOUT:
            self.header_timeouts += 1
        elif event is StageEvent.READ_TIMEOUT:
            self.read_timeouts += 1
        elif event is StageEvent.UNFRAMEABLE_REQUEST:
            self.unframeable_requests += 1
        else:
            self.unframeable_responses += 1

    def exported(self) -> dict[str, int]:
        """The counters `/metrics` exports, by their `SERVER_COUNTERS` key."""
        return {
            "connections_accepted": self.connections_accepted,
            "connections_failed": self.connections_failed,
            "connections_refused": self.connections_refused,
            "header_timeouts": self.header_timeouts,
            "read_timeouts": self.read_timeouts,
            "unframeable_requests": self.unframeable_requests,
            "h2_reset_floods": self.h2_reset_floods,
            "h2_streams_reset_before_dial": self.h2_streams_reset_before_dial,
            "unframeable_responses": self.unframeable_responses,
        }

    def scenario_info(self) -> tuple[str, int] | None:
        """The active scenario's name and number of faults, when there is one."""
        return None


# ServerCounters exported as counters, with their Prometheus name and help.
SERVER_COUNTERS = {
    "connections_accepted": ("middlebox_connections_total", "Client connections accepted."),
    "connections_failed": (
        "middlebox_upstream_connect_failures_total",
        "Connections whose upstream could not be reached.",
    ),
    "connections_refused": (
        "middlebox_connections_refused_total",
        "Connections closed at once because max_connections was reached.",
    ),
    "header_timeouts": (
        "middlebox_client_header_timeouts_total",
        "Connections closed by client_header_timeout.",
    ),
    "read_timeouts": ("middlebox_read_timeouts_total", "Upstream read timeouts (nginx 504)."),
    "unframeable_requests": (
        "middlebox_unframeable_requests_total",
        "Requests the framer refused, answered as nginx does (400/405/501) and closed.",
    ),
    "h2_reset_floods": (
        "middlebox_h2_reset_floods_total",
        "HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM: client resets past the budget.",
    ),
    "h2_streams_reset_before_dial": (
        "middlebox_h2_streams_reset_before_dial_total",
        "HTTP/2 streams reset (by the client, or a failed connection) before their upstream dial.",
    ),
    "unframeable_responses": (
        "middlebox_unframeable_responses_total",
        "Upstream responses the framer refused (nginx's 502 before the head, else a close).",
    ),
}


@dataclass
class Metrics:
    """Counters the relay and the fault sinks update; `render` writes Prometheus text."""

    bytes: dict[tuple[str, str, str], int] = field(default_factory=dict)
    faults: dict[tuple[str, str], int] = field(default_factory=dict)
    # fault -> connections it fired on: a count, not the ids (a proxy up for a day serves
    # millions); each connection's sink remembers which faults it has counted already.
    faulted_connections: dict[str, int] = field(default_factory=dict)
    _generation: int = 0  # bumped by `reset`: a connection counts again after one
    scenario_header: dict[str, int] = field(default_factory=dict)
    baseline: dict[str, int] = field(default_factory=dict)
    journal_baseline: int = 0

    def observe(self, inner: RelayObserver | None) -> CountingObserver:
        return CountingObserver(self, inner)

    def sink(
        self, connection_id: int, inner: Callable[[FaultReport], None] | None
    ) -> Callable[[FaultReport], None]:
        counted: dict[str, int] = {}  # fault -> the generation it was counted in

        def record(report: FaultReport) -> None:
            key = (report.fault, report.action)
            self.faults[key] = self.faults.get(key, 0) + 1
            fault = report.fault
            if counted.get(fault) != self._generation:
                counted[fault] = self._generation
                self.faulted_connections[fault] = self.faulted_connections.get(fault, 0) + 1
            if inner is not None:
                inner(report)

        return record

    def reset(self, server: ServerCounters, store: JournalStore | None) -> None:
        self.bytes.clear()
        self.faults.clear()
        self.faulted_connections.clear()
        self._generation += 1
        self.scenario_header.clear()
        self.baseline = server.exported()
        self.journal_baseline = store.dropped if store is not None else 0

    def render(self, server: ServerCounters, store: JournalStore | None) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {number_text(value)}" for labels, value in samples)

        counted = server.exported()
        for attribute, (name, help_text) in SERVER_COUNTERS.items():
            value = counted[attribute] - self.baseline.get(attribute, 0)
            family(name, "counter", help_text, [("", value)])
        family(
            "middlebox_connections_active",
            "gauge",
            "Connections being relayed now (active streams).",
            [("", server.active)],
        )
        family(
            "middlebox_bytes_total",
            "counter",
            "Bytes relayed, by leg (client or upstream), direction and operation.",
            [
                (label_text(leg=leg, direction=direction, op=op), value)
                for (op, leg, direction), value in sorted(self.bytes.items())
            ],
        )
        family(
            "middlebox_faults_fired_total",
            "counter",
            "Fault decisions reported, by fault and action.",
            [
                (label_text(fault=fault, action=action), value)
                for (fault, action), value in sorted(self.faults.items())
            ],
        )
        family(
            "middlebox_fault_connections_total",
            "counter",
            "Connections on which a fault fired at least once, by fault.",
            [
                (label_text(fault=fault), connections)
                for fault, connections in sorted(self.faulted_connections.items())
            ],
        )
        if store is not None:
            family(
                "middlebox_journal_dropped_total",
                "counter",
                "Journal records dropped because a connection's journal was full.",
                [("", store.dropped - self.journal_baseline)],
            )
            family(
                "middlebox_journal_connections",
                "gauge",
                "Connection journals held in memory.",
                [("", len(store.journals))],
            )
            family(
                "middlebox_journal_evicted_total",
                "counter",
                "Connection journals evicted to keep the newest ones.",
                [("", store.evicted)],
            )
        if self.scenario_header:
            family(
                "middlebox_scenario_header_total",
                "counter",
                "Connections that chose their scenario with X-Middlebox-Scenario.",
                [(label_text(scenario=n), v) for n, v in sorted(self.scenario_header.items())],
            )
        scenario = server.scenario_info()
        if scenario is not None:
            name, faults = scenario
            family(
                "middlebox_scenario_info",
                "gauge",
                "The active scenario (value 1) and its number of faults.",
                [(label_text(name=name, faults=str(faults)), 1)],
            )
        return "\n".join(out) + "\n"


class CountingObserver:
    """Counts bytes per leg and direction, then passes every call on to `inner`."""

    __slots__ = ("inner", "metrics")

    def __init__(self, metrics: Metrics, inner: RelayObserver | None) -> None:
        self.metrics = metrics
        self.inner = inner

    def _count(self, op: str, leg: str, direction: Direction, size: int) -> None:
        key = (op, leg, direction.value)
        counters = self.metrics.bytes
        counters[key] = counters.get(key, 0) + size

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self._count("read", leg, direction, len(data))
        if self.inner is not None:
            self.inner.read(leg, direction, data, now)

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self._count("wrote", leg, direction, len(data))
        if self.inner is not None:
            self.inner.wrote(leg, direction, data, now)

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        if self.inner is not None:
            self.inner.ended(leg, direction, kind, now)


def label_text(**labels: str) -> str:
    """`{key="value",...}`, each value escaped as the text format asks (also the canary's)."""

    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{key}="{escape(value)}"' for key, value in labels.items()) + "}"


def number_text(value: float) -> str:
    """A sample's value: an integer without `.0`, any other float as Python writes it."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# Gauges whose value is the same in every worker (not a share of a total): a sum over
# workers would multiply them, so the sum keeps the largest.
SAME_IN_EVERY_WORKER = frozenset({"middlebox_scenario_info"})


def sum_expositions(texts: list[str]) -> str:
    """One exposition for several workers' `render`s: each series summed over them, as
    Prometheus' multiprocess mode sums counters and live gauges (connections active,
    journals held); HELP/TYPE lines once, in the order first seen."""
    order: list[str] = []  # comment lines and series keys, first seen first
    values: dict[str, float] = {}
    for text in texts:
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                if line not in order:
                    order.append(line)
                continue
            series, _, number = line.rpartition(" ")
            try:
                value = float(number)
            except ValueError:
                continue
            if series not in values:
                order.append(series)
                values[series] = value
            elif series.split("{", 1)[0] in SAME_IN_EVERY_WORKER:
                values[series] = max(values[series], value)
            else:
                values[series] += value
    lines = [
        entry if entry not in values else f"{entry} {number_text(values[entry])}" for entry in order
    ]
    return "\n".join(lines) + "\n"
