"""The control API: a small HTTP/1.1 server (trio + h11) beside a running proxy.

Routes (JSON unless noted):
- `GET /metrics`: Prometheus text (see `middlebox.observe.metrics`);
- `GET /scenario`: the active scenario; `PUT /scenario` with a YAML body validates it
  like `middlebox validate`, in a child process within a time and memory budget
  (`middlebox.shell.scenario_parse`; 400 with every problem) and makes it active for new
  connections (live ones keep theirs); an `upstream:` or `workload:` block other than the
  active scenario's is refused (400: a live proxy starts no upstream and runs no clients)
  unless the request says `?ignore=upstream,workload`; `DELETE /scenario` clears it to
  pass-through; `GET /scenario`'s `document` is the live scenario as a body PUT takes back;
- `GET /faults`: the active path, each fault with its index and options as a scenario
  writes them; `POST /faults` adds one (`{"fault": NAME, "options": {...}, "at": N}` or
  a path entry `{NAME: {...}}`, JSON or YAML), `PATCH /faults/{index|name}` merges a change
  into one fault's options, `DELETE /faults/{index|name}` removes it, `DELETE /faults`
  removes them all; each is validated by the same loader as `PUT /scenario` (400 with every
  problem) and applies to new connections (see `middlebox.shell.fault_edits`);
- `GET /scenarios`: the names `X-Middlebox-Scenario` may pick (from `--scenario-dir`);
- `POST /counters/reset`: zero the counters and forget the journals;
- `GET /journals`: one summary per connection journal held; `GET /journals/{id}`: that
  connection's journal as NDJSON (secrets redacted).

Security: it binds loopback by default; on any other address a bearer token is
required (the CLI refuses to start without one), and when a token is set every
request must carry `Authorization: Bearer TOKEN` (compared in constant time).

Per-request scenarios: with `allow_scenario_header`, a connection whose first request
carries `X-Middlebox-Scenario: NAME` runs `NAME.yaml` from the scenario directory,
so parallel tests can each pick their faults through one proxy. The head is read
with MSG_PEEK, so the bytes stay in the socket for the relay and the stream stays
byte-exact. The choice is per connection (the first request decides).

`middlebox.run.background.BackgroundProxy` runs a `ControlledProxy` in a thread for
synchronous callers (the pytest plugin, `middlebox drill start`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import ipaddress
import json
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import h11
import trio
import yaml

from middlebox.core.fault import FaultReport, Pipeline
from middlebox.core.scenario_state import SharedState
from middlebox.observe.journal import JournalStore
from middlebox.observe.metrics import CONTENT_TYPE, Metrics
from middlebox.observe.observer import RelayObserver
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.model import Scenario
from middlebox.shell import fault_edits, scenario_parse
from middlebox.shell.fault_edits import EditError
from middlebox.shell.live import LiveConnection
from middlebox.shell.scenario_parse import Parsed
from middlebox.shell.server import (
    Address,
    ProxyServer,
    listening_as,
    relay_clock_offset,
    run_proxy,
)

log = logging.getLogger("middlebox.shell.control")

MAX_BODY = 1024 * 1024
# `/faults` bodies are parsed on the event loop (PUT /scenario's in a child process).
MAX_FAULT_BODY = 64 * 1024
# A refused upload's answer lists at most this many problems, each cut to a line: a 1 MiB
# body of 100,000 unknown keys must not be answered with 15 MB of them.
MAX_PROBLEMS = 100
MAX_PROBLEM_CHARS = 500
# Uploads waiting for a parse slot (`scenario_parse.MAX_PARSES` run at once), and for how
# long, before the answer is 503 with Retry-After.
MAX_PARSES_WAITING = 4
PARSE_WAIT = 5.0
REQUEST_TIMEOUT = 10.0
PEEK_TIMEOUT = 5.0
PEEK_LIMIT = 64 * 1024
SCENARIO_HEADER = "x-middlebox-scenario"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_HEADER = re.compile(rb"(?im)^x-middlebox-scenario[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?$")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def pass_through() -> Scenario:
    return Scenario(name="pass-through", description="no faults: a byte-exact relay")


def scenario_json(scenario: Scenario) -> dict[str, Any]:
    return {
        "name": scenario.name,
        "description": scenario.description,
        "seed": scenario.seed,
        "source": scenario.source,
        "path": [
            {"fault": spec.name, "config": {k: _plain(v) for k, v in spec.config.items()}}
            for spec in scenario.path
        ],
        "document": fault_edits.scenario_document(scenario),
    }


LIVE_SECTIONS = {
    "upstream": "the upstream is already running (a live proxy starts none; restart the "
    "emulator, or `middlebox drill start`/the pytest fixture, with this block)",
    "workload": "a live proxy runs no clients (the workload is `middlebox run`'s)",
}
"""Scenario blocks a live proxy cannot apply, and why."""


def unappliable_sections(
    scenario: Scenario, active: Scenario, ignored: frozenset[str]
) -> list[str]:
    """Why `scenario` cannot be applied as written: each `upstream:`/`workload:` block it
    gives that differs from the active scenario's, unless the sender said to ignore it."""
    return [
        f"{name}: {why}; it differs from the active scenario's, so it would be silently "
        f"ignored: send `?ignore={name}` (or ignore=upstream,workload) to apply the rest"
        for name, why in LIVE_SECTIONS.items()
        if name in scenario.sections
        and name not in ignored
        and scenario.sections[name] != active.sections.get(name)
    ]


def _plain(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return repr(value)


class ScenarioLoader(Protocol):
    """How the proxy reads scenarios it is sent or may be asked for by name. The shell knows
    no fault library: the composition (`middlebox.run.serve.LIBRARY_SCENARIOS`) passes it."""

    suffixes: tuple[str, ...]

    def file(self, path: Path) -> Scenario:
        """A scenario file; raises ScenarioError with every problem."""
        ...

    def text(self, text: str, name: str) -> Scenario:
        """A scenario from YAML text (`name` stands in for the file in problems)."""
        ...


# ------------------------------------------------------------------ the proxy


@dataclass(eq=False)
class ControlledProxy(ProxyServer):
    """A `ProxyServer` with a journal store, live metrics and optional per-connection
    scenario selection through a request header."""

    # The newest 256 connections, 256 KiB captured per leg and direction (a long answer
    # is ~100 KiB of SSE): a long-running proxy's journals stay within ~256 MiB.
    store: JournalStore = field(
        default_factory=lambda: JournalStore(
            capture=True, max_connections=256, max_capture_bytes=256 * 1024
        )
    )
    metrics: Metrics = field(default_factory=Metrics)
    scenario_dir: Path | None = None
    allow_scenario_header: bool = False
    loader: ScenarioLoader = field(kw_only=True)
    _shared_by_scenario: dict[str, list[SharedState]] = field(default_factory=dict)
    _loaded: dict[str, Scenario] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        # Its store and metrics see every connection, whatever journal the config names.
        self.config = dataclasses.replace(
            self.config, observer_factory=self._observer, report_sink_factory=self._sink
        )

    def _observer(self, connection_id: int, scenario: Scenario) -> RelayObserver:
        return self.metrics.observe(
            self.store.observer(connection_id, time.time(), scenario.name, relay_clock_offset())
        )

    def _sink(self, connection_id: int) -> Callable[[FaultReport], None]:
        return self.metrics.sink(connection_id, self.store.fault_sink(connection_id))

    def set_scenario(self, scenario: Scenario) -> None:
        super().set_scenario(scenario)
        self._shared_by_scenario = {}

    def apply_edit(self, edit: fault_edits.Edit) -> None:
        """The active scenario with an edited path, for new connections (live ones keep
        theirs). Untouched faults keep their cross-connection state (a count of requests
        seen); an added or changed one starts fresh."""
        self.scenario = dataclasses.replace(self.scenario, path=edit.path)
        self.shared = [
            self.shared[kept] if kept is not None else self.new_shared(self.scenario, index)[0]
            for index, kept in enumerate(edit.kept)
        ]

    def named_scenarios(self) -> list[str]:
        if self.scenario_dir is None or not self.scenario_dir.is_dir():
            return []
        return sorted(
            p.stem
            for p in self.scenario_dir.iterdir()
            if p.suffix in self.loader.suffixes
            and _NAME.match(p.stem)
            and self._inside_scenario_dir(p)
        )

    def _inside_scenario_dir(self, path: Path) -> bool:
        """Whether `path`, links followed, is a file inside the scenario directory (its
        real path too): a link in it to `/etc/...` or `../other` names nothing."""
        assert self.scenario_dir is not None
        try:
            real = path.resolve(strict=True)
            return real.is_file() and real.is_relative_to(self.scenario_dir.resolve(strict=True))
        except (OSError, RuntimeError):  # a dangling link, a loop of links
            return False

    def named_scenario(self, name: str) -> Scenario:
        """`NAME.yaml` from the scenario directory; raises LookupError when not there, or
        when it is a link to a file outside the directory."""
        if self.scenario_dir is None or not _NAME.match(name) or ".." in name:
            raise LookupError(name)
        for suffix in self.loader.suffixes:
            path = self.scenario_dir / f"{name}{suffix}"
            if self._inside_scenario_dir(path):
                if name not in self._loaded:
                    self._loaded[name] = self.loader.file(path.resolve())
                return self._loaded[name]
        raise LookupError(name)

    def make_pipeline(self, scenario: Scenario, connection_id: int) -> Pipeline:
        if scenario is self.scenario:
            return super().make_pipeline(scenario, connection_id)
        # A header-chosen scenario keeps its own cross-connection fault state.
        saved = self.shared
        if scenario.name not in self._shared_by_scenario:
            self._shared_by_scenario[scenario.name] = self.new_shared(scenario)
        self.shared = self._shared_by_scenario[scenario.name]
        try:
            return super().make_pipeline(scenario, connection_id)
        finally:
            self.shared = saved

    async def _handle(
        self,
        client: socket.socket,
        connection_id: int,
        scenario: Scenario,
        live: LiveConnection,
        helpers: trio.Nursery | None = None,
    ) -> None:
        if self.allow_scenario_header:
            head = await peek_head(client)
            match = _HEADER.search(head.split(b"\r\n\r\n", 1)[0])
            if match:
                name = match.group(1).decode("latin-1")
                try:
                    scenario = self.named_scenario(name)
                except (LookupError, ScenarioError) as error:
                    log.info("connection %d: unusable scenario %r: %s", connection_id, name, error)
                    await answer_and_close(client, 400, f"unknown scenario {name!r}\n")
                    return
                self.metrics.scenario_header[name] = self.metrics.scenario_header.get(name, 0) + 1
        await super()._handle(client, connection_id, scenario, live, helpers)


async def peek_head(sock: socket.socket) -> bytes:
    """The client's first request head, read with MSG_PEEK so it stays in the socket.

    Peeked bytes keep the socket readable, so after a peek that found no head end the
    socket is told to wake only once more bytes than those have arrived (SO_RCVLOWAT:
    Linux's poll honours it for TCP, socket(7); a FIN or an error still wakes it): a
    head that stays partial costs one peek, not one every few milliseconds until
    PEEK_TIMEOUT. The pause between peeks bounds a client dripping a byte at a time."""
    data = b""
    try:
        with trio.move_on_after(PEEK_TIMEOUT):
            while True:
                await trio.lowlevel.wait_readable(sock)
                try:
                    data = sock.recv(PEEK_LIMIT, socket.MSG_PEEK)
                except BlockingIOError:
                    continue
                except OSError:
                    return b""
                if not data or b"\r\n\r\n" in data or len(data) >= PEEK_LIMIT:
                    return data
                with contextlib.suppress(OSError):  # without it: a peek every 5 ms
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, len(data) + 1)
                await trio.sleep(0.005)
    finally:
        with contextlib.suppress(OSError):  # the relay reads whatever has arrived
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
    return data


async def answer_and_close(sock: socket.socket, status: int, text: str) -> None:
    body = text.encode()
    reason = reason_phrase(status)
    response = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    try:
        await trio.lowlevel.wait_writable(sock)
        sock.send(response)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


_REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def reason_phrase(status: int) -> str:
    """RFC 9110's reason phrase for `status` (the status line's text, e.g. `Not Found`)."""
    return _REASONS.get(status, "Error")


# ------------------------------------------------------------ the control API


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def json(cls, status: int, value: Any, *headers: tuple[str, str]) -> Response:
        return cls(status, (json.dumps(value, indent=1) + "\n").encode(), headers=headers)


@dataclass(frozen=True)
class Request:
    """One request as a route's handler takes it: `path` without query or trailing slash."""

    method: str
    path: str
    target: str
    body: bytes
    parsed: Parsed | None = None


Handler = TypeVar("Handler")


@dataclass(frozen=True)
class Route:
    """A path a port serves and the methods it takes there; a `{...}` part is one segment."""

    path: str
    methods: tuple[str, ...]

    def matches(self, path: str) -> bool:
        prefix, brace, _ = self.path.partition("{")
        if not brace:
            return path == self.path
        rest = path[len(prefix) :]
        return path.startswith(prefix) and bool(rest) and "/" not in rest

    def __str__(self) -> str:
        return f"{'|'.join(self.methods)} {self.path}"


def find_route(
    routes: Sequence[tuple[Route, Handler]], method: str, path: str
) -> Handler | Response | None:
    """The handler of the route `path` matches; a 405 naming the methods it takes when
    `method` is none of them; None when no route matches."""
    for route, handler in routes:
        if route.matches(path):
            if method in route.methods:
                return handler
            *others, last = route.methods
            methods = f"{', '.join(others)} or {last}" if others else last
            return Response.json(405, {"error": f"use {methods} on {route.path}"})
    return None


def not_found(method: str, path: str, routes: Iterable[Route]) -> Response:
    """The 404 of a port: the routes it serves, from its routing table."""
    return Response.json(
        404, {"error": f"no route {method} {path}", "routes": [str(route) for route in routes]}
    )


@dataclass
class ControlApi:
    """Routes a request to the proxy it controls; pure of sockets (tests call `route`)."""

    proxy: ControlledProxy
    token: str | None = None
    parse_slots: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(scenario_parse.MAX_PARSES)
    )
    parses_waiting: int = 0
    # routes a server in front of this API answers on the same port (the console's), so a
    # 404 there lists what that port really serves
    served_before: tuple[Route, ...] = ()

    def authorised(self, headers: dict[str, str]) -> bool:
        if not self.token:
            return True
        given = headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode())

    def parse_here(self, body: bytes) -> Parsed:
        """A PUT body parsed in this thread: for callers of `route` without a socket (tests,
        the in-process transport of `middlebox.run.live`), never on the relay's loop."""
        return scenario_parse.parse_text(self.proxy.loader, body, UPLOAD_NAME)

    async def parse_upload(self, body: bytes) -> Parsed | Response:
        """A PUT body parsed once, in a child process (`scenario_parse`), while this event
        loop goes on relaying; a 503 with Retry-After when every parse slot stays busy."""
        if self.parse_slots.available_tokens == 0 and self.parses_waiting >= MAX_PARSES_WAITING:
            return busy()
        acquired = False
        self.parses_waiting += 1
        try:
            with trio.move_on_after(PARSE_WAIT):
                await self.parse_slots.acquire()
                acquired = True
        finally:
            self.parses_waiting -= 1
        if not acquired:
            return busy()
        try:
            return await scenario_parse.parse_in_child(self.proxy.loader, body, UPLOAD_NAME)
        finally:
            self.parse_slots.release()

    def route(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        parsed: Parsed | None = None,
    ) -> Response:
        """The answer to one request. A `PUT /scenario` body comes `parsed` (off the loop,
        by `parse_upload`); without it, it is parsed here (`parse_here`)."""
        if not self.authorised(headers):
            return Response.json(401, {"error": "missing or wrong bearer token"})
        path = target.split("?", 1)[0].rstrip("/") or "/"
        found = find_route(CONTROL_ROUTES, method, path)
        if isinstance(found, Response):
            return found
        if found is None:
            return not_found(method, path, (*self.served_before, *(r for r, _ in CONTROL_ROUTES)))
        return found(self, Request(method, path, target, body, parsed))

    def _metrics(self, request: Request) -> Response:
        proxy = self.proxy
        return Response(200, proxy.metrics.render(proxy, proxy.store).encode(), CONTENT_TYPE)

    def _scenario(self, request: Request) -> Response:
        proxy = self.proxy
        if request.method == "GET":
            return Response.json(200, scenario_json(proxy.scenario))
        if request.method == "DELETE":
            proxy.set_scenario(pass_through())
            return Response.json(200, scenario_json(proxy.scenario))
        try:
            ignored = _ignored(request.target)
        except EditError as error:
            return Response.json(error.status, error.body())
        parsed = request.parsed or self.parse_here(request.body)
        scenario = parsed.scenario
        if scenario is None:
            return Response.json(400, {"error": parsed.error, **bounded_problems(parsed.problems)})
        refused = unappliable_sections(scenario, proxy.scenario, ignored)
        if refused:
            return Response.json(
                400, {"error": "cannot apply this scenario live", "problems": refused}
            )
        proxy.set_scenario(scenario)
        return Response.json(200, scenario_json(scenario))

    def _faults(self, request: Request) -> Response:
        if len(request.body) > MAX_FAULT_BODY:
            # one fault's options: small, so the loader's parse never stalls the relay
            return Response.json(413, {"error": f"a fault body over {MAX_FAULT_BODY} bytes"})
        try:
            return self.faults(request.method, request.path, request.body)
        except EditError as error:
            return Response.json(error.status, error.body())

    def _scenarios(self, request: Request) -> Response:
        proxy = self.proxy
        return Response.json(
            200,
            {
                "active": proxy.scenario.name,
                "header_allowed": proxy.allow_scenario_header,
                "available": proxy.named_scenarios(),
            },
        )

    def _reset_counters(self, request: Request) -> Response:
        proxy = self.proxy
        proxy.metrics.reset(proxy, proxy.store)
        proxy.store.clear()
        return Response.json(200, {"reset": True})

    def _journals(self, request: Request) -> Response:
        store = self.proxy.store
        return Response.json(
            200,
            {
                "journals": [
                    {**journal.summary(), "started_at": journal.started_at}
                    for journal in store.journals.values()
                ],
                "evicted": store.evicted,
            },
        )

    def _journal(self, request: Request) -> Response:
        ident = request.path.rsplit("/", 1)[1]
        journal = self.proxy.store.journals.get(int(ident)) if ident.isdigit() else None
        if journal is None:
            return Response.json(404, {"error": f"no journal for connection {ident}"})
        lines = journal.to_lines()
        text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        return Response(200, text.encode(), "application/x-ndjson")

    def faults(self, method: str, path: str, body: bytes) -> Response:
        """`/faults` and `/faults/{index|name}`: one fault at a time (fault_edits)."""
        proxy = self.proxy
        load_text = proxy.loader.text
        reference = path[len("/faults/") :] if path.startswith("/faults/") else None
        if reference is None:
            if method == "GET":
                return self._faults_answer(200)
            if method == "POST":
                entry, at = fault_edits.entry_of(_body_value(body))
                specs = fault_edits.loaded_entries([entry], load_text, "<POST /faults>")
                edit = fault_edits.inserted(proxy.scenario, specs, at)
                proxy.apply_edit(edit)
                return self._faults_answer(201, added=list(edit.touched))
            proxy.apply_edit(fault_edits.Edit((), (), tuple(range(len(proxy.scenario.path)))))
            return self._faults_answer(200)
        index = fault_edits.position(proxy.scenario, reference)
        if method == "GET":
            return Response.json(200, fault_edits.listing(proxy.scenario)[index])
        if method == "PATCH":
            proxy.apply_edit(
                fault_edits.changed(proxy.scenario, index, _body_value(body), load_text)
            )
            return self._faults_answer(200, changed=index)
        gone = fault_edits.listing(proxy.scenario)[index]
        proxy.apply_edit(fault_edits.removed(proxy.scenario, index))
        return self._faults_answer(200, removed=gone)

    def _faults_answer(self, status: int, **what: Any) -> Response:
        scenario = self.proxy.scenario
        return Response.json(
            status,
            {"scenario": scenario.name, **what, "faults": fault_edits.listing(scenario)},
        )

    async def answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> Response:
        """`route`, with an authorised `PUT /scenario` body parsed off the loop first."""
        path = target.split("?", 1)[0].rstrip("/") or "/"
        if method == "PUT" and path == "/scenario" and self.authorised(headers):
            try:
                _ignored(target)  # a misspelt ignore= is refused before a child parses
            except EditError as error:
                return Response.json(error.status, error.body())
            parsed = await self.parse_upload(body)
            if isinstance(parsed, Response):
                return parsed
            return self.route(method, target, headers, body, parsed)
        return self.route(method, target, headers, body)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        """HTTP/1.1 with keep-alive, one request at a time, every read bounded in time."""
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
        try:
            while True:
                with trio.move_on_after(REQUEST_TIMEOUT) as bound:
                    request, body = await read_request(connection, stream)
                if bound.cancelled_caught or request is None:
                    return
                if body is None:
                    response = Response.json(413, {"error": f"body over {MAX_BODY} bytes"})
                else:
                    headers = {
                        name.decode("latin-1").lower(): value.decode("latin-1")
                        for name, value in request.headers
                    }
                    try:
                        response = await self.answer(
                            request.method.decode("ascii"),
                            request.target.decode("latin-1"),
                            headers,
                            body,
                        )
                    except Exception as error:  # a bug must not kill the control port
                        log.exception("control request failed")
                        response = Response.json(500, {"error": repr(error)})
                keep = body is not None and connection.our_role is h11.SERVER
                await stream.send_all(encode_response(connection, response, keep))
                if not next_cycle(connection, keep):
                    return
        except h11.RemoteProtocolError as error:
            await refuse_malformed(stream, connection, error)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await stream.aclose()


CONTROL_ROUTES: tuple[tuple[Route, Callable[[ControlApi, Request], Response]], ...] = (
    (Route("/metrics", ("GET",)), ControlApi._metrics),
    (Route("/scenario", ("GET", "PUT", "DELETE")), ControlApi._scenario),
    (Route("/faults", ("GET", "POST", "DELETE")), ControlApi._faults),
    (Route("/faults/{index|name}", ("GET", "PATCH", "DELETE")), ControlApi._faults),
    (Route("/scenarios", ("GET",)), ControlApi._scenarios),
    (Route("/counters/reset", ("POST",)), ControlApi._reset_counters),
    (Route("/journals", ("GET",)), ControlApi._journals),
    (Route("/journals/{id}", ("GET",)), ControlApi._journal),
)
"""The control API's routing table: what `route` dispatches on and what its 404 lists."""


async def refuse_malformed(
    stream: trio.SocketStream, connection: h11.Connection, error: h11.RemoteProtocolError
) -> None:
    """Bytes that are no HTTP/1.1 request (a garbage request line, `Content-Length: abc`)
    get h11's status for them (400; 431 for a head over the limit) and its reason in one
    line, then the close, as nginx and the proxy port answer: curl shows why rather than
    an empty reply. h11 lets a server answer after the peer's error while no response of
    its own has begun (its `our_state` still IDLE or SEND_RESPONSE)."""
    if connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    reason = str(error).splitlines()[0] if str(error) else "malformed request"
    response = Response.json(error.error_status_hint, {"error": f"bad HTTP request: {reason}"})
    with contextlib.suppress(
        h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError
    ):
        await stream.send_all(encode_response(connection, response, keep=False))


def encode_response(
    connection: h11.Connection,
    response: Response,
    keep: bool,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """`response` as `connection` sends it, whole: head (with `extra` headers, and
    `Connection: close` unless `keep`), body and end."""
    out = connection.send(
        h11.Response(
            status_code=response.status,
            # h11 leaves the reason empty unless told; curl -i and people read it
            reason=reason_phrase(response.status).encode(),
            headers=[
                ("content-type", response.content_type),
                ("content-length", str(len(response.body))),
                *extra,
                *response.headers,
                *([] if keep else [("connection", "close")]),
            ],
        )
    )
    out = (out or b"") + (connection.send(h11.Data(data=response.body)) or b"")
    return out + (connection.send(h11.EndOfMessage()) or b"")


def next_cycle(connection: h11.Connection, keep: bool) -> bool:
    """Whether the connection takes another request after the response just sent."""
    if connection.our_state is h11.MUST_CLOSE or not keep:
        return False
    try:
        connection.start_next_cycle()
    except h11.LocalProtocolError:
        return False
    return True


UPLOAD_NAME = "<PUT /scenario>"


def busy() -> Response:
    """Every parse slot taken for `PARSE_WAIT`: come back later (RFC 9110 §15.6.4, 503 with
    Retry-After, as nginx's limit_req answers a burst it will not queue)."""
    return Response.json(
        503,
        {"error": "scenario uploads are being parsed; try again shortly"},
        ("retry-after", "1"),
    )


def bounded_problems(problems: tuple[str, ...]) -> dict[str, Any]:
    """A refusal's problems for the answer: the first MAX_PROBLEMS, each cut to
    MAX_PROBLEM_CHARS, and how many more there were."""
    shown = [
        p if len(p) <= MAX_PROBLEM_CHARS else p[: MAX_PROBLEM_CHARS - 3] + "..."
        for p in problems[:MAX_PROBLEMS]
    ]
    more = len(problems) - len(shown)
    return {"problems": shown, **({"more_problems": more} if more else {})}


def _ignored(target: str) -> frozenset[str]:
    """`?ignore=upstream,workload`: the blocks the sender knows a live proxy leaves alone;
    an EditError (400) naming any other name, which would otherwise pass unnoticed."""
    query = target.partition("?")[2]
    names: set[str] = set()
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key == "ignore":
            names.update(name.strip() for name in value.split(",") if name.strip())
    unknown = sorted(names - set(LIVE_SECTIONS))
    if unknown:
        raise EditError(
            400,
            f"ignore= names no block a live proxy leaves alone: {', '.join(unknown)} "
            f"(it takes {', '.join(LIVE_SECTIONS)})",
        )
    return frozenset(names)


def _body_value(body: bytes) -> Any:
    """A `/faults` body: JSON, or YAML (JSON is YAML), as plain data; an EditError (400)
    placing a syntax error at its line and column in the body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise EditError(400, "the body must be a JSON or YAML mapping: not UTF-8 text") from None
    try:
        return yaml.safe_load(text) if text.strip() else None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        detail = " ".join(part for part in (error.context, error.problem) if part)
        raise EditError(400, f"the body must be a JSON or YAML mapping: {where}{detail}") from None
    except yaml.YAMLError as error:  # ReaderError: NUL and other control characters
        reason = getattr(error, "reason", None) or str(error).splitlines()[0]
        raise EditError(400, f"the body must be a JSON or YAML mapping: {reason}") from None


async def read_request(
    connection: h11.Connection, stream: trio.SocketStream, limit: int = MAX_BODY
) -> tuple[h11.Request | None, bytes | None]:
    """The next request and its body (None when the body is over `limit` bytes); (None,
    None) when the peer closed or sent no request."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            connection.receive_data(data)
            if not data and request is None:
                return None, None
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > limit:
                return request, None
        elif isinstance(event, h11.EndOfMessage):
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None, None


async def serve_http(
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    address: Address,
    *,
    role: str = "control",
    alongside: Callable[[], Awaitable[None]] | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on `address` and run `handler` for each connection (and `alongside`, if given,
    for as long); started with the port bound (`address.port` 0: the one chosen). A failed
    listen is a ListenError naming `role`."""
    with listening_as(role, address):
        listeners = await trio.open_tcp_listeners(address.port, host=address.host)
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        if alongside is not None:
            nursery.start_soon(alongside)
        task_status.started(port)
        await trio.serve_listeners(handler, listeners, handler_nursery=nursery)


async def serve_control(
    api: ControlApi, address: Address, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    await serve_http(api.serve_connection, address, task_status=task_status)


def check_control_access(address: Address, token: str | None) -> None:
    """Refuse to expose the control API beyond loopback without a token, and refuse a
    token with whitespace in it: a blank one (`--control-token " "`) would pass for a
    token and open a non-loopback address, and RFC 6750's bearer token (b64token) has
    no whitespace, so no client could send it."""
    if token and (not token.strip() or any(c.isspace() for c in token)):
        raise ValueError(
            f"the control token {token!r} has whitespace in it: a bearer token is one "
            "word (RFC 6750: letters, digits and -._~+/=)"
        )
    if not is_loopback(address.host) and not token:
        raise ValueError(
            f"the control API on {address} (not loopback) needs a token: pass "
            f"--control-token or set MIDDLEBOX_CONTROL_TOKEN"
        )


async def run_controlled_proxy(
    proxy: ControlledProxy,
    listen_address: Address,
    control_address: Address,
    *,
    token: str | None = None,
    ready: Callable[[int, int], None] | None = None,
    grace: float = 10.0,
    backlog: int = 1024,
) -> ControlledProxy:
    """Serve the proxy and its control API until SIGINT/SIGTERM (`run_proxy`'s shutdown)."""
    check_control_access(control_address, token)
    api = ControlApi(proxy, token)
    async with trio.open_nursery() as nursery:
        control_port = await nursery.start(serve_control, api, control_address)

        def proxy_ready(port: int) -> None:
            if ready is not None:
                ready(port, control_port)

        await run_proxy(listen_address, proxy, ready=proxy_ready, grace=grace, backlog=backlog)
        nursery.cancel_scope.cancel()
    return proxy
