"""`middlebox probe-upstream`: an OpenAI-wire upstream that plays, per request, the exact
stream shape the request asks for, and records what reached it.

Deployed where the LLM server stands (behind a user's ingress, or on a second route of
it), it answers `POST .../v1/chat/completions` and `.../v1/completions` with the shape in
the request's knobs (middlebox/scenario/probe_shape.py: the `X-Middlebox-Probe` header,
the body's `middlebox_probe` field, or a `middlebox-probe:` line in the prompt), written
on the plan's absolute schedule; `GET .../v1/models` and `GET .../health` as vLLM does; and
`GET .../probe/requests/ID` with the record of request ID: its request line, HTTP version,
headers and body as they arrived (after every hop; credentials blanked by the journal's
redaction rule), the peer address, and every write's time, how late it ran, and when and
how it learned the client left: a FIN (the peer's EOF on the read side), an RST
(ECONNRESET), or a failed write, with the frames written before and after. Paths match by
their end, so a route prefix (`/probe-llm/v1/...`) works as is.

It learns of a leave the moment it happens, also during a pause: between writes it waits in
`poll()` on the socket, as an event loop does. On a leave it stops (`on_leave=stop`, as
vLLM aborts a request whose client disconnected) or writes on until a write fails
(`on_leave=ignore`, an upstream that ignores half-closes), which shows how long a hop keeps
its upstream connection after its client left.

Stdlib sockets, one thread per connection (bounded by `max_connections`; one past it gets
a 503), requests framed by the core's HTTP/1.1 framer (keep-alive and pipelining as any
HTTP/1.1 server); the last `keep` records stay, older ones are dropped.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import errno
import json
import math
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from middlebox.core.http1 import Head, Http1Framer, Piece, PieceKind
from middlebox.observe.journal import DEFAULT_REDACTION
from middlebox.scenario import probe_shape
from middlebox.scenario.probe_shape import Plan, ProbeShape, ProbeSpecError

MODEL = "middlebox-probe"
KEEP = 256  # records kept (the newest)
MAX_CONNECTIONS = 256
MAX_BODY = 1024 * 1024  # a request body past this is refused (413)
MAX_PENDING = 2 * MAX_BODY  # bytes a connection may send ahead of its answers
BODY_KEEP = 64 * 1024  # bytes of each request body a record keeps
MAX_TIMES = 10_000  # write times a record keeps (counts go on past it)
HEAD_TIMEOUT = 30.0  # seconds for a request's head and body (nginx's client_header_timeout 60s)
SEND_TIMEOUT = 60.0  # seconds one write may block on a reader that stopped (nginx send_timeout)
CLOSE_WAIT = 1.0  # seconds after our FIN for the peer's, before the socket is closed
REFUSE_WAIT = 0.1  # the same, after an error answer (and for a refused request to arrive)
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST


class _ClientLeft(Exception):
    """The client left and the shape says stop."""


@dataclass
class _Connection:
    """One client connection: its socket, the framer of what it sends, and how its side
    ended. Bytes sent while a response streams (a pipelined request) are framed and kept
    up to MAX_PENDING; past that they are dropped and the connection ends after the
    response (`overflow`), while a FIN or an RST is still seen."""

    sock: socket.socket
    peer: str
    framer: Http1Framer = field(default_factory=lambda: Http1Framer("request"))
    pieces: collections.deque[Piece] = field(default_factory=collections.deque)
    closed: str | None = None  # "fin", "rst" or "error" once the peer's side is gone
    closed_errno: str | None = None
    pending: int = 0  # bytes framed and not yet taken by _read_request
    overflow: bool = False
    _poller: Any = None

    def read_some(self, timeout: float | None) -> bool:
        """Wait up to `timeout` seconds for bytes (None: poll once); frame them. False
        when the wait ended with nothing new. poll(2), not select(2): any fd number."""
        if self.closed is not None:
            return False
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self.sock, select.POLLIN)
        # rounded up: waking before a write is due would spin on a zero wait
        if not self._poller.poll(math.ceil(timeout * 1000) if timeout else 0):
            return False
        try:
            data = self.sock.recv(65536)
        except OSError as error:
            self.closed = "rst" if error.errno == errno.ECONNRESET else "error"
            self.closed_errno = errno.errorcode.get(error.errno or 0, str(error.errno))
            return True
        if not data:
            self.closed = "fin"
            self.pieces.extend(self.framer.feed_eof())
            return True
        if self.pending + len(data) > MAX_PENDING:
            self.overflow = True
            return True
        self.pending += len(data)
        self.pieces.extend(self.framer.feed(data))
        return True


@dataclass
class _Request:
    head: Head
    body: bytes
    raw_head: bytes


class ProbeUpstream:
    """The probe upstream on `host:port` (0: a free port; `port` once constructed).
    `start()` serves in background threads, `close()` stops; `record(id)` is a copy of a
    request's record or None. `now` (monotonic seconds) and `wall` are the clocks."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        keep: int = KEEP,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._keep = keep
        self._records: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closing = threading.Event()
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._serial = 0
        self.now: Callable[[], float] = time.monotonic
        self.wall: Callable[[], float] = time.time

    def start(self) -> ProbeUpstream:
        self._accepting.start()
        return self

    def __enter__(self) -> ProbeUpstream:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        try:
            # wakes the thread blocked in accept() (Linux); close() alone would not
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        if self._accepting.is_alive():
            self._accepting.join(timeout=5)

    def serve_forever(self) -> None:
        """Serve until Ctrl-C (KeyboardInterrupt) or `close()` (the command calls it on
        SIGTERM)."""
        self.start()
        try:
            while not self._closing.wait(1.0):
                pass
        finally:
            self.close()

    def record(self, ident: str) -> dict[str, Any] | None:
        """A deep copy of request `ident`'s record (the writer goes on appending)."""
        with self._lock:
            found = self._records.get(ident)
            return copy.deepcopy(found) if found is not None else None

    def records(self) -> list[str]:
        """The ids kept, oldest first."""
        with self._lock:
            return list(self._records)

    # -- connections ------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                sock, address = self._listener.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                _refuse(sock)
                continue
            peer = (
                f"[{address[0]}]:{address[1]}"
                if ":" in address[0]
                else f"{address[0]}:{address[1]}"
            )
            thread = threading.Thread(target=self._serve, args=(sock, peer), daemon=True)
            thread.start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        try:
            with sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(SEND_TIMEOUT)
                connection = _Connection(sock, peer)
                while not self._closing.is_set():
                    request = _read_request(connection)
                    if request is None or not self._respond(connection, request):
                        return
        except OSError:
            return
        finally:
            self._slots.release()

    def _respond(self, connection: _Connection, request: _Request) -> bool:
        """Answer one request; True when the connection stays open for the next."""
        head = request.head
        path = (head.target or "").split("?", 1)[0].rstrip("/")
        keep = head.keep_alive
        if head.method == "GET" and path.endswith("/health"):
            return _answer(connection, 200, None, keep)
        if head.method == "GET" and path.endswith("/v1/models"):
            models = {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                  "owned_by": "middlebox"}]}  # fmt: skip
            return _answer(connection, 200, models, keep)
        if head.method == "GET" and "/probe/requests" in path:
            ident = path.rsplit("/probe/requests", 1)[1].strip("/")
            # a record changes while its stream runs: a caching hop on the path (Varnish
            # keeps a GET's 200 for 120 s by default) must not answer it from a stale copy
            if not ident:
                return _answer(connection, 200, {"ids": self.records()}, keep, no_store=True)
            found = self.record(ident)
            if found is None:
                missing = _error(f"no record of request {ident!r}")
                return _answer(connection, 404, missing, keep, no_store=True)
            return _answer(connection, 200, found, keep, no_store=True)
        if head.method == "POST" and path.endswith(("/v1/chat/completions", "/v1/completions")):
            return self._stream(connection, request, chat=path.endswith("/chat/completions"))
        return _answer(connection, 404, _error(f"no route for {head.method} {path}"), keep)

    def _stream(self, connection: _Connection, request: _Request, *, chat: bool) -> bool:
        received, wall = self.now(), self.wall()
        head = request.head
        http10 = head.version == "HTTP/1.0"
        try:
            body = json.loads(request.body or b"{}")
            source, knobs = probe_shape.knobs_in_request(head.header(probe_shape.HEADER), body)
            shape = probe_shape.parse_knobs(knobs) if knobs is not None else ProbeShape()
            if shape.format is None:
                shape = dataclasses.replace(shape, format="chat" if chat else "completion")
            if not isinstance(body, dict):
                raise ProbeSpecError("the request body is not a JSON object")
            if body.get("stream") is False:
                raise ProbeSpecError('the probe upstream only streams: send "stream": true')
            ident = shape.id or self._next_id()
            model = str(body.get("model") or MODEL)
            plan = probe_shape.plan(
                shape, http10=http10, ident=ident, model=model, keep_alive=head.keep_alive
            )
        except ValueError as error:  # ProbeSpecError and bad JSON alike
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            return _answer(connection, 400, _error(message), head.keep_alive)
        record = self._new_record(ident, wall, connection, request, shape, source, plan)
        _Player(self, connection, plan, shape, record, received).play()
        return plan.keep_alive and record["ended"] in ("done", "clean")

    def _next_id(self) -> str:
        with self._lock:
            self._serial += 1
            return f"r{self._serial}"

    def _new_record(
        self,
        ident: str,
        wall: float,
        connection: _Connection,
        request: _Request,
        shape: ProbeShape,
        source: str,
        plan: Plan,
    ) -> dict[str, Any]:
        head = request.head
        record: dict[str, Any] = {
            "id": ident,
            "received_at": wall,
            "peer": connection.peer,
            # anyone who reaches the route reads records: credentials are blanked by the
            # journal's rule (Authorization, *-Key, *token fields ...), names and sizes kept
            "request": {
                "method": head.method,
                "target": DEFAULT_REDACTION.target(head.target or ""),
                "version": head.version,
                "headers": DEFAULT_REDACTION.headers(head.headers),
                "head_bytes": len(request.raw_head),
                "body": DEFAULT_REDACTION.data(request.body[:BODY_KEEP]).decode("utf-8", "replace"),
                "body_bytes": len(request.body),
            },
            "spec": shape.render(),
            "spec_source": source,
            "framing": plan.framing,
            "frame_bytes": plan.frame_bytes,
            "content_length": plan.content_length,
            "planned": {"frames": plan.frames, "end": plan.end, "end_at": plan.end_at},
            "writes": {"head": None, "frames": [], "heartbeats": [], "done": None},
            "lateness": [],
            "frames_written": 0,
            "heartbeats_written": 0,
            "client_left": None,
            "frames_after_leave": 0,
            "ended": "in-progress",
            "ended_at": None,
        }
        with self._lock:
            self._records.pop(ident, None)
            self._records[ident] = record
            while len(self._records) > self._keep:
                self._records.popitem(last=False)
        return record

    def _update(self, record: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
        with self._lock:
            change(record)


class _Player:
    """Writes one plan on its schedule, watching the socket for the client's leave."""

    def __init__(
        self,
        server: ProbeUpstream,
        connection: _Connection,
        plan: Plan,
        shape: ProbeShape,
        record: dict[str, Any],
        received: float,
    ) -> None:
        self.server, self.connection, self.plan = server, connection, plan
        self.shape, self.record, self.received = shape, record, received

    def since(self) -> float:
        return round(self.server.now() - self.received, 6)

    def play(self) -> None:
        ended: str = self.plan.end
        try:
            for write in self.plan.writes:
                self.wait_until(write.at)
                self.send(write)
            if self.plan.end_at > self.plan.writes[-1].at:
                # a pause after the last frame before a cut end; a whole answer is not
                # re-checked, so a client closing as soon as it read the end is no leave
                self.wait_until(self.plan.end_at)
        except _ClientLeft:
            ended = "client-left"
        except TimeoutError:
            ended = "write-timeout"
        except OSError as error:
            self.note_leave("write-failed", errno.errorcode.get(error.errno or 0, str(error)))
            ended = "write-failed"
        self.finish(ended)

    def wait_until(self, due: float) -> None:
        """Sleep until `due` (seconds after the request), learning of a leave as it
        happens; raises _ClientLeft when the client left and the shape says stop."""
        while True:
            self.check_left()
            left = self.received + due - self.server.now()
            if left <= 0:
                return
            if self.connection.closed is not None:
                time.sleep(left)  # nothing more to learn from the read side
            else:
                self.connection.read_some(left)

    def check_left(self) -> None:
        connection = self.connection
        if connection.closed is None:
            connection.read_some(None)
        if connection.closed is not None and self.record["client_left"] is None:
            self.note_leave(connection.closed, connection.closed_errno)
        if self.record["client_left"] is not None and self.shape.on_leave == "stop":
            raise _ClientLeft

    def note_leave(self, how: str, error: str | None) -> None:
        at, written = self.since(), self.record["frames_written"]

        def change(record: dict[str, Any]) -> None:
            if record["client_left"] is None:
                left: dict[str, Any] = {"how": how, "at": at, "frames_written": written}
                if error:
                    left["errno"] = error
                record["client_left"] = left

        self.server._update(self.record, change)

    def send(self, write: probe_shape.Write) -> None:
        self.connection.sock.sendall(write.data)
        done = self.since()
        lateness = max(round(done - write.at, 6), 0.0)

        def change(record: dict[str, Any]) -> None:
            if len(record["lateness"]) < MAX_TIMES:
                record["lateness"].append(lateness)
            writes = record["writes"]
            if write.kind == "frame":
                record["frames_written"] += 1
                if record["client_left"] is not None:
                    record["frames_after_leave"] += 1
                if len(writes["frames"]) < MAX_TIMES:
                    writes["frames"].append(done)
            elif write.kind == "heartbeat":
                record["heartbeats_written"] += 1
                if len(writes["heartbeats"]) < MAX_TIMES:
                    writes["heartbeats"].append(done)
            elif write.kind in ("head", "done"):
                writes[write.kind] = done

        self.server._update(self.record, change)

    def finish(self, ended: str) -> None:
        """Say how the response ended, then close as the end asks: an RST, or a FIN when
        the body is close-delimited, cut (`fin`) or the request asked to close."""
        at = self.since()

        def change(record: dict[str, Any]) -> None:
            record["ended"], record["ended_at"] = ended, at

        self.server._update(self.record, change)
        sock = self.connection.sock
        if ended == "rst" or ended == "write-timeout":
            # an abort; for a reader that stopped, as nginx's send_timeout ends it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        elif ended == "fin" or self.plan.framing == "close" or not self.plan.keep_alive:
            _close_with_fin(self.connection)


def _close_with_fin(connection: _Connection, wait: float = CLOSE_WAIT) -> None:
    """Our FIN, then the peer's (bounded by `wait`), so close() leaves no unread byte to
    turn into an RST (RFC 2525 §2.17)."""
    try:
        connection.sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    deadline = time.monotonic() + wait
    while connection.closed is None and (left := deadline - time.monotonic()) > 0:
        connection.read_some(left)


def _refuse(sock: socket.socket) -> None:
    """A 503 for a connection past the limit, on the accepting thread: its request read
    first and the close a FIN (a close with the request unread would be an RST, and the
    client might never read the answer), each wait bounded by REFUSE_WAIT."""
    with sock:
        sock.settimeout(1.0)  # a 503 fits any socket buffer; a stuck peer is not waited for
        connection = _Connection(sock, "")
        connection.read_some(REFUSE_WAIT)
        _answer(connection, 503, _error("too many connections to the probe upstream"))


def _read_request(connection: _Connection) -> _Request | None:
    """The next whole request on the connection (head and body), or None when the peer
    closed, sent something that is not HTTP/1.x, or took longer than HEAD_TIMEOUT."""
    deadline = time.monotonic() + HEAD_TIMEOUT
    head: Head | None = None
    raw_head = b""
    body = bytearray()
    while True:
        if connection.overflow:
            return None
        while connection.pieces:
            piece = connection.pieces.popleft()
            connection.pending -= len(piece.data)
            if piece.kind is PieceKind.HEAD:
                head, raw_head = piece.head, piece.data
            elif piece.kind is PieceKind.BODY:
                body += piece.data
                if len(body) > MAX_BODY:
                    _answer(connection, 413, _error("request body over 1 MiB"), False)
                    return None
            elif piece.kind is PieceKind.OPAQUE:
                reason = connection.framer.degraded or "not HTTP/1.x"
                _answer(connection, 400, _error(f"bad request: {reason}"), False)
                return None
            if piece.end_of_message and head is not None:
                return _Request(head, bytes(body), raw_head)
        if connection.closed is not None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        connection.read_some(left)


def _error(message: str) -> dict[str, Any]:
    """OpenAI's error body: the message is one line."""
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _answer(
    connection: _Connection,
    status: int,
    payload: object,
    keep_alive: bool = False,
    *,
    no_store: bool = False,
) -> bool:
    """A whole JSON answer (Content-Length); True when the connection stays open, else
    it is closed with a FIN (its unread bytes read first, bounded). `no_store` adds
    `Cache-Control: no-store` (RFC 9111 §5.2.2.5: no cache may keep it)."""
    reasons = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Content Too Large",
               503: "Service Unavailable"}  # fmt: skip
    data = b"" if payload is None else json.dumps(payload).encode() + b"\n"
    head = [f"HTTP/1.1 {status} {reasons[status]}", f"content-length: {len(data)}"]
    if payload is not None:
        head.append("content-type: application/json")
    if no_store:
        head.append("cache-control: no-store")
    if not keep_alive:
        head.append("connection: close")
    try:
        connection.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    except OSError:
        return False
    if not keep_alive:
        _close_with_fin(connection, REFUSE_WAIT)
    return keep_alive
