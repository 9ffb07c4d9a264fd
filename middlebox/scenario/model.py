"""The scenario model: a validated scenario as frozen dataclasses (pure).

A scenario names an incident and the faults that reproduce it, in path order,
client side first:

    name: nginx-default-buffering
    description: nginx's default proxy_buffering holds the whole stream.
    seed: 7
    path:
      - proxy_buffering: {buffer_size: 4KiB}
      - idle_reaper: {timeout: 60s}

`load.py` turns YAML into these; `scenario_warnings` names combinations that load but
cannot do what they say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from middlebox.core.fault import Bytes, Fault, Seconds
from middlebox.core.sse import MAX_EVENT, MAX_LINE, SseLimits
from middlebox.scenario.convert import Problem


@dataclass(frozen=True)
class FaultSpec:
    """One entry of `path:`: a fault class and its validated config, built per connection."""

    cls: type[Fault]
    config: Mapping[str, Any]
    line: int = 0

    @property
    def name(self) -> str:
        return self.cls.name

    def build(self) -> Fault:
        return self.cls(**self.config)


@dataclass(frozen=True)
class TlsOptions:
    """TLS toward the client (`proxy: {tls: {}}`, or `middlebox proxy --tls`): the proxy
    terminates TLS with a certificate for `hostnames`, issued by a local CA it creates in
    `ca_dir` (default: $MIDDLEBOX_CA_DIR or ~/.local/share/middlebox/ca) and that clients
    trust (curl --cacert DIR/ca.pem); ALPN offers `alpn` in order (docs/tls-http2.md)."""

    alpn: tuple[Literal["h2", "http/1.1"], ...] = ("h2", "http/1.1")
    hostnames: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
    ca_dir: str | None = None

    def __post_init__(self) -> None:
        if not self.alpn:
            raise ValueError("tls.alpn must offer at least one protocol (h2, http/1.1)")
        if not self.hostnames:
            raise ValueError("tls.hostnames must name at least one host for the certificate")


@dataclass(frozen=True)
class ProxyOptions:
    """How the proxy itself behaves, like a real proxy's defaults (nginx answers 502)."""

    on_upstream_unreachable: Literal["502", "reset", "close"] = "502"
    # A request the framer refuses while an HTTP-aware fault is in the path (a smuggled
    # request, CL+TE, a malformed request line, CONNECT): `reject` answers as nginx does
    # (400/405/501 page, Connection: close) and closes (faults/_proxy/fail_closed.py);
    # `pass_through` passes the rest on unparsed, for tests of garbage handling only.
    on_unframeable_request: Literal["reject", "pass_through"] = "reject"
    connect_timeout: Seconds = 5.0
    # nginx's client_header_timeout (60 s): a client that has not sent its first request
    # head by then is closed unanswered (slowloris); null waits forever.
    client_header_timeout: Seconds | None = 60.0
    # nginx's proxy_read_timeout, off unless set (middlebox is transparent unless told):
    # no upstream byte for this long with a request outstanding -> 504, or a close
    # mid-response. It is the idle_reaper fault with the proxy's own ends (one read
    # timeout: faults/_proxy/proxy_read_timeout.py), composed by compose.PROXY_STAGES.
    read_timeout: Seconds | None = None
    # nginx's keepalive_timeout (75 s there) and client_body_timeout (60 s there, answered
    # 408), off unless set; either one also makes client_header_timeout time every request
    # head of a kept-alive connection, not only the first (faults/_proxy/request_timeouts.py).
    keepalive_timeout: Seconds | None = None
    client_body_timeout: Seconds | None = None
    # Connections beyond this many at once are accepted and closed at once, and counted.
    max_connections: int | None = None
    # TLS toward the client (docs/tls-http2.md); null: cleartext, the relay's unchanged fast path.
    tls: TlsOptions | None = None
    # What an SSE-aware fault (cut, sse_ids, ...) lets the framing hold of one event-stream
    # line and of one event. nginx has no SSE notion and passes such bytes as they come;
    # a fault that reads lines must hold one whole, so a peer that never ends one would
    # grow the proxy without end. Past the bound the faults step aside for the rest of that
    # response (reported `stepped_aside`) and its bytes pass as they come. 1 MiB each: a
    # vLLM chunk is a few hundred bytes, a large tool-call delta tens of KB.
    sse_max_line: Bytes = MAX_LINE
    sse_max_event: Bytes = MAX_EVENT

    def __post_init__(self) -> None:
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be at least 1 (or null for no limit)")
        for name in ("sse_max_line", "sse_max_event"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 byte")
        for name in (
            "client_header_timeout",
            "read_timeout",
            "keepalive_timeout",
            "client_body_timeout",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive (or null to turn it off)")

    @property
    def sse_limits(self) -> SseLimits:
        return SseLimits(self.sse_max_line, self.sse_max_event)


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. `sections` holds the converted optional blocks by name."""

    name: str
    description: str = ""
    seed: int = 0
    path: tuple[FaultSpec, ...] = ()
    proxy: ProxyOptions = field(default_factory=ProxyOptions)
    sections: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<string>"
    # Faults the scenario expects NOT to fire: it shows a fix keeps them quiet (heartbeats
    # keep an idle reaper from firing). The runner fails the run if one fires.
    quiet_faults: tuple[str, ...] = ()
    # Combinations that load but cannot do what they say (see scenario_warnings).
    warnings: tuple[Problem, ...] = ()

    def build_faults(self) -> list[Fault]:
        return [spec.build() for spec in self.path]


# Config fields that count SSE events of the response. A vLLM stream of max_tokens
# tokens has at most max_tokens + 4 events: the role chunk, one per token, the
# finish_reason chunk, the usage chunk and `data: [DONE]` (docs/emulator.md, "Wire behaviour").
EVENT_COUNT_FIELDS = ("after_events", "at_event", "after_event", "event", "events")
EVENTS_BEYOND_TOKENS = 4
_COUNTS = ("events", "tokens")


def scenario_warnings(scenario: Scenario) -> list[Problem]:
    """Impossible combinations that still load: a fault set to fire after more events
    than the workload's streams can have, or later than the client gives up. They are
    warnings, not errors: the run goes on and the fault is reported as never fired.

    A fault class may add its own by defining `scenario_warnings(self, workload)`
    returning messages (the workload section, or None)."""
    workload = scenario.sections.get("workload")
    max_tokens = getattr(workload, "max_tokens", None)
    timeout = getattr(workload, "timeout", None)
    found: list[Problem] = []
    for index, spec in enumerate(scenario.path):
        where = f"path[{index}] {spec.name}"
        messages: list[str] = []
        if isinstance(max_tokens, int):
            limit = max_tokens + EVENTS_BEYOND_TOKENS
            for name in EVENT_COUNT_FIELDS:
                value = spec.config.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > limit:
                    messages.append(
                        f"{name}: {value} can never be reached: with workload max_tokens "
                        f"{max_tokens} a stream has at most {limit} events"
                    )
        # `after: events|tokens` with `count: N` (faults/cut.py): tokens carry text, so
        # at most max_tokens of them; events add the role, finish, usage and [DONE] frames.
        after = spec.config.get("after", getattr(spec.cls, "after", None))
        count = spec.config.get("count", getattr(spec.cls, "count", None))
        if isinstance(max_tokens, int) and isinstance(count, int) and after in _COUNTS:
            limit = max_tokens + (EVENTS_BEYOND_TOKENS if after == "events" else 0)
            if count > limit:
                messages.append(
                    f"count: cutting after {count} {after} never happens: with workload "
                    f"max_tokens {max_tokens} a stream has at most {limit} {after}"
                )
        when, at = "at", spec.config.get("at")
        if after == "time" and isinstance(spec.config.get("time"), int | float):
            when, at = "time", spec.config["time"]
        if isinstance(timeout, int | float) and isinstance(at, int | float) and at > timeout:
            messages.append(
                f"{when}: {at:g}s is after the workload's timeout ({timeout:g}s): it never fires"
            )
        hook = getattr(spec.cls, "scenario_warnings", None)
        if callable(hook):
            try:
                messages += list(hook(spec.build(), workload))
            except Exception as error:  # a fault's own check must not break loading
                messages.append(f"its scenario_warnings check failed: {error!r}")
        found += [Problem(scenario.source, spec.line or 1, 1, f"{where}: {m}") for m in messages]
    return found
