"""The console's HTTP server (trio + h11): the page, its live feed and the control API.

Routes, every one behind the control API's authorisation (loopback free; with a token,
`Authorization: Bearer TOKEN` or `?token=TOKEN`, since a browser's EventSource sends no
header; compared in constant time):
- `GET /`: the page (static package data, its script and style inlined: one request, no
  CDN, nothing to build);
- `GET /feed`: Server-Sent Events, `event: update` with the connection list whenever the
  model moved, coalesced to at most one per FEED_INTERVAL (10 a second), further apart while
  the pages' work (the list, the details they ask) would pass FEED_CPU_SHARE of a core, and
  at least one a second (a stall is the absence of change); each carries its spacing
  (`feed_interval`); `event: drill` with the drill's state when it changes;
- `GET /api/connections` (`?all=1`: every one held, not the newest 60), `GET
  /api/streams/{id}`: the same list, and one stream's two sides;
- `GET /api/presets`: the presets a fault list may add; `GET /api/drill`: the drill's state;
- `GET /api/stats`: what the pages cost, measured by the console itself: `page_cpu_s`, the
  CPU seconds (the proxy thread's clock) of every feed's turns and of every answer the
  console gives (a page's or a `curl`'s alike), summed since the start; this request is
  the measurer's, not counted;
- anything else (`/faults`, `/scenario`, `/metrics`...): the control API's own routes
  (`shell.control.ControlApi`), so an edit from the page is the edit `curl` makes, with the
  loader's file:line problems in its answer.

`attach` wraps the proxy's per-connection observer factory (`ControlledProxy._observer`, the
journal's): each new connection's journal is handed to the model, which reads it off the hot
path (`middlebox.console.model`); the relay's observer itself is unchanged.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import h11
import trio

from middlebox.console.model import ConsoleModel
from middlebox.shell.control import (
    ControlApi,
    ControlledProxy,
    Request,
    Response,
    Route,
    check_control_access,
    encode_response,
    find_route,
    next_cycle,
    read_request,
    refuse_malformed,
    serve_control,
    serve_http,
)
from middlebox.shell.server import Address, relay_clock_offset, run_proxy

log = logging.getLogger("middlebox.console.server")

FEED_INTERVAL = 0.1  # at most 10 updates a second, whatever the proxy carries
FEED_IDLE = 1.0  # an update at least this often: the classifier's clock moves
# The pages' work (the list, the streams they open) may take this share of one core: past
# it updates come less often than FEED_INTERVAL (never less than once per FEED_IDLE), so a
# busy proxy spends its CPU relaying, and the feed slows rather than the streams.
FEED_CPU_SHARE = 0.005
REQUEST_TIMEOUT = 10.0
MAX_REQUEST_BODY = 64 * 1024


def asset(name: str) -> str:
    return resources.files("middlebox.console").joinpath("static", name).read_text("utf-8")


def page() -> bytes:
    html = asset("index.html")
    html = html.replace("/*CONSOLE_CSS*/", asset("console.css"))
    return html.replace("/*CONSOLE_JS*/", asset("console.js")).encode()


@dataclass
class Console:
    """The console of one proxy: its model, the control API it fronts, and the extras the
    composition passes (preset names; a drill's state, asked each time it may change)."""

    proxy: ControlledProxy
    token: str | None = None
    model: ConsoleModel = field(default_factory=ConsoleModel)
    presets: tuple[str, ...] = ()
    drill: Callable[[], dict[str, Any] | None] = lambda: None
    clock: Callable[[], float] = trio.current_time
    cpu_clock: Callable[[], float] = time.thread_time
    # the feed's current spacing: FEED_INTERVAL, longer while the pages' work would
    # otherwise pass FEED_CPU_SHARE
    interval: float = FEED_INTERVAL
    listings: int = 0  # connection lists built (not reused)
    details: int = 0  # stream details built (not reused)
    # CPU seconds spent on the pages' behalf: each feed's turns (the list, the drill, the
    # frame) and each page request's answer (its dispatch, the list or detail, the
    # response's bytes), timed between the points where the task yields, so no other
    # task's CPU is counted; the refresh that runs with or without a page is not in it
    page_cpu: float = 0.0
    pages: int = 0  # feeds attached now
    _cached: tuple[int, float, bytes] | None = None
    _detail: tuple[int, int, float, bytes] | None = None
    _spent: float = 0.0  # CPU seconds of page work since the last list was built

    def __post_init__(self) -> None:
        served = tuple(route for route, _ in CONSOLE_ROUTES)
        self.api = ControlApi(self.proxy, self.token, served_before=served)

    def attach(self) -> None:
        """See every connection the proxy opens from now on (after the journal does)."""
        proxy, model = self.proxy, self.model
        observers = proxy.config.observer_factory

        def observer(connection_id: int, scenario: Any) -> Any:
            inner = observers(connection_id, scenario) if observers else None
            model.track(
                connection_id,
                scenario.name,
                proxy.store.journals.get(connection_id),
                self.clock(),
                relay_clock_offset(),
            )
            return inner

        # as ControlledProxy itself wires its store: the config's factory, replaced
        proxy.config = dataclasses.replace(proxy.config, observer_factory=observer)

    def authorised(self, headers: dict[str, str], target: str) -> bool:
        if not self.token:
            return True
        if self.api.authorised(headers):
            return True
        given = _query(target).get("token", "")
        return hmac.compare_digest(given.encode(), self.token.encode())

    def listing(self) -> bytes:
        """The connection list as JSON, computed once per model version and tick."""
        now = self.clock()  # the model is as fresh as `refresh_forever` keeps it
        cached = self._cached
        if cached is not None and cached[0] == self.model.version and now - cached[1] < FEED_IDLE:
            return cached[2]
        began = self.cpu_clock()
        self.listings += 1
        listing = self.model.listing(now)
        # the spacing this update came at: the page says how live it is
        listing.update(scenario=self.proxy.scenario.name, feed_interval=round(self.interval, 3))
        body = json.dumps(listing, separators=(",", ":")).encode()
        self._cached = (self.model.version, now, body)
        # this update's cost (the list, and the details asked since the last one) sets how
        # soon the next may come: cost / interval stays within FEED_CPU_SHARE
        spent = self._spent + self.cpu_clock() - began
        self.interval = min(FEED_IDLE, max(FEED_INTERVAL, spent / FEED_CPU_SHARE))
        self._spent = 0.0
        return body

    def detail(self, ident: int) -> bytes | None:
        """One stream's detail as JSON; the same answer again while the model has not moved
        and within the feed's interval (a page asks once per update it gets)."""
        now = self.clock()
        cached = self._detail
        if (
            cached is not None
            and cached[:2] == (ident, self.model.version)
            and now - cached[2] < self.interval
        ):
            return cached[3]
        began = self.cpu_clock()
        found = self.model.stream(ident, now)
        if found is None:
            return None
        self.details += 1
        body = json.dumps(found, separators=(",", ":")).encode()
        self._detail = (ident, self.model.version, now, body)
        self._spent += self.cpu_clock() - began
        return body

    async def answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> Response:
        if not self.authorised(headers, target):
            return Response.json(401, {"error": "missing or wrong token"})
        path = target.split("?", 1)[0].rstrip("/") or "/"
        found = find_route(CONSOLE_ROUTES, method, path)
        if isinstance(found, Response):
            return found
        if found is not None:
            return found(self, Request(method, path, target, body))
        if self.token:  # the page's token, as the control API takes it
            headers = {**headers, "authorization": f"Bearer {self.token}"}
        return await self.api.answer(method, target, headers, body)

    def _page(self, request: Request) -> Response:
        return Response(200, page(), "text/html; charset=utf-8")

    def _feed_elsewhere(self, request: Request) -> Response:
        # `serve_connection` streams an authorised GET /feed on its own connection before
        # any answer is asked; a caller of `answer` gets the reason there is none here
        return Response.json(400, {"error": "GET /feed is an event stream: open it on its own"})

    def _connections(self, request: Request) -> Response:
        if _query(request.target).get("all") == "1":
            every = self.model.listing(self.clock(), limit=None)
            return Response.json(200, {**every, "scenario": self.proxy.scenario.name})
        return Response(200, self.listing(), "application/json")

    def _stream(self, request: Request) -> Response:
        ident = request.path.rsplit("/", 1)[1]
        found = self.detail(int(ident)) if ident.isdigit() else None
        if found is None:
            return Response.json(404, {"error": f"no connection {ident} held"})
        return Response(200, found, "application/json")

    def _presets(self, request: Request) -> Response:
        return Response.json(200, {"presets": list(self.presets)})

    def _drill(self, request: Request) -> Response:
        return Response.json(200, {"drill": self.drill()})

    def _stats(self, request: Request) -> Response:
        stats = {"page_cpu_s": self.page_cpu, "pages": self.pages}
        return Response.json(200, {**stats, "listings": self.listings, "details": self.details})

    async def refresh_forever(self) -> None:
        """Frame what arrived every FEED_INTERVAL, watched or not: unframed bytes wait at
        most that long (the model's memory stays bounded without a page attached)."""
        while True:
            self.model.refresh()
            await trio.sleep(FEED_INTERVAL)

    async def feed(self, stream: trio.SocketStream, connection: h11.Connection) -> None:
        """The live feed: an update when the model moved, at most every FEED_INTERVAL (less
        often while the pages' work would pass FEED_CPU_SHARE of a core)."""
        self.pages += 1
        try:
            await self._feed(stream, connection)
        finally:
            self.pages -= 1

    async def _feed(self, stream: trio.SocketStream, connection: h11.Connection) -> None:
        began = self.cpu_clock()
        head = connection.send(
            h11.Response(
                status_code=200,
                reason=b"OK",
                headers=[
                    ("content-type", "text/event-stream"),
                    ("cache-control", "no-store"),
                    ("x-accel-buffering", "no"),
                ],
            )
        )
        self.page_cpu += self.cpu_clock() - began
        await stream.send_all(head or b"")
        sent_version, sent_at, drill_sent = -1, -FEED_IDLE, ""
        while True:
            began = self.cpu_clock()
            now = self.clock()
            out = b""
            if self.model.version != sent_version or now - sent_at >= FEED_IDLE:
                sent_version, sent_at = self.model.version, now
                out += b"event: update\ndata: " + self.listing() + b"\n\n"
            drill = json.dumps(self.drill(), separators=(",", ":"))
            if drill != drill_sent:
                drill_sent = drill
                out += b"event: drill\ndata: " + drill.encode() + b"\n\n"
            data = (connection.send(h11.Data(data=out)) or b"") if out else b""
            self.page_cpu += self.cpu_clock() - began
            if data:
                await stream.send_all(data)
            await trio.sleep(self.interval)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
        try:
            while True:
                with trio.move_on_after(REQUEST_TIMEOUT) as bound:
                    request, body = await read_request(connection, stream, MAX_REQUEST_BODY)
                if bound.cancelled_caught or request is None:
                    return
                began = self.cpu_clock()
                headers = {
                    name.decode("latin-1").lower(): value.decode("latin-1")
                    for name, value in request.headers
                }
                method = request.method.decode("ascii")
                target = request.target.decode("latin-1")
                path = target.split("?", 1)[0].rstrip("/")
                if method == "GET" and path == "/feed" and self.authorised(headers, target):
                    self.page_cpu += self.cpu_clock() - began
                    await self.feed(stream, connection)
                    return
                if body is None:
                    response = Response.json(413, {"error": "body too large"})
                else:
                    if method == "PUT" and path == "/scenario":
                        # the upload waits for a parse slot and is parsed in a child
                        # process (ControlApi.parse_upload): this task yields meanwhile,
                        # so only its own turns before and after are timed
                        self.page_cpu += self.cpu_clock() - began
                    try:
                        response = await self.answer(method, target, headers, body)
                    except Exception as error:  # a bug must not take the console down
                        log.exception("console request failed")
                        response = Response.json(500, {"error": repr(error)})
                    if method == "PUT" and path == "/scenario":
                        began = self.cpu_clock()
                keep = body is not None
                out = encode_response(connection, response, keep, (("cache-control", "no-store"),))
                if path != "/api/stats":  # the measurer's own request is not a page's work
                    self.page_cpu += self.cpu_clock() - began
                await stream.send_all(out)
                if not next_cycle(connection, keep):
                    return
        except h11.RemoteProtocolError as error:
            await refuse_malformed(stream, connection, error)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await stream.aclose()


CONSOLE_ROUTES: tuple[tuple[Route, Callable[[Console, Request], Response]], ...] = (
    (Route("/", ("GET",)), Console._page),
    (Route("/index.html", ("GET",)), Console._page),
    (Route("/feed", ("GET",)), Console._feed_elsewhere),
    (Route("/api/connections", ("GET",)), Console._connections),
    (Route("/api/streams/{id}", ("GET",)), Console._stream),
    (Route("/api/presets", ("GET",)), Console._presets),
    (Route("/api/drill", ("GET",)), Console._drill),
    (Route("/api/stats", ("GET",)), Console._stats),
)
"""The console's own routes, before the control API's: what `answer` dispatches on and
what a 404 on the console's port lists, with the control API's."""


def _query(target: str) -> dict[str, str]:
    pairs = (pair.partition("=") for pair in target.partition("?")[2].split("&") if pair)
    return {key: value for key, _, value in pairs}


async def serve_console(
    console: Console, address: Address, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    await serve_http(
        console.serve_connection,
        address,
        role="ui",
        alongside=console.refresh_forever,
        task_status=task_status,
    )


def check_ui_access(address: Address, token: str | None) -> None:
    """The control API's rule, for the console: beyond loopback only with a token."""
    try:
        check_control_access(address, token)
    except ValueError as error:
        raise ValueError(str(error).replace("the control API", "the console (--ui)")) from None


async def run_console_proxy(
    console: Console,
    listen_address: Address,
    ui_address: Address,
    *,
    control_address: Address | None = None,
    ready: Callable[[int, int, int | None], None] | None = None,
    grace: float = 10.0,
    backlog: int = 1024,
) -> ControlledProxy:
    """Serve the proxy, its console and (if asked) its control API until a signal."""
    check_ui_access(ui_address, console.token)
    proxy = console.proxy
    console.attach()
    async with trio.open_nursery() as nursery:
        ui_port = await nursery.start(serve_console, console, ui_address)
        control_port = None
        if control_address is not None:
            check_control_access(control_address, console.token)
            control_port = await nursery.start(serve_control, console.api, control_address)

        def proxy_ready(port: int) -> None:
            if ready is not None:
                ready(port, ui_port, control_port)

        await run_proxy(listen_address, proxy, ready=proxy_ready, grace=grace, backlog=backlog)
        nursery.cancel_scope.cancel()
    return proxy
