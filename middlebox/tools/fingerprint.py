"""`middlebox fingerprint URL`: measure what stands between a client and the probe upstream.

URL is the path's front door, an OpenAI base URL (`https://api.example.com/probe-llm/v1`)
whose upstream is `middlebox probe-upstream` (docs/fingerprint.md). Each measure sends probe
shapes (`probe_shape.request_for`: the knobs in the header and in the prompt) over a raw
socket, timing every read, then reads the probe's record of the request through the same
front door (`.../probe/requests/ID`) and hands both to the pure measures in
middlebox/scenario/fingerprint.py:

- hold: two shapes of the same length, the second with twice the bytes per second, tell a
  buffer size from a timer and from a hold to the end; a third with the response header
  `X-Accel-Buffering: no` tells whether the hold obeys it;
- framing and headers: the first request's record (version, framing, headers as they
  arrived) against what was sent, and the client's response head against the probe's;
- compression: the 256-byte hold shape asked with `Accept-Encoding: gzip`; its hold on the
  decoded body says whether the compressed bytes flow per frame or are held;
- SSE fields: a short stream with `id:` lines, a `retry:` field and `: keep-alive`
  comments during a pause, asked with a `Last-Event-ID` header;
- leave: a client that closes after a few frames, with a FIN and then with an RST
  (SO_LINGER 0); the record says when the probe learned;
- the three long waits share what the budget has left (one that ends early leaves its
  time to the next): the head held back (a timeout before the head, and how it ends), a
  steady stream (a duration cap), and two frames then a silence (the read timeout after
  the head); the record says when a hop closed the upstream connection ("at least" the
  wait otherwise). A playback (`--verify`) takes the long waits the path took, each as
  long as the path's (or long enough to see its cut), and no other.

`--direct URL` runs the same measures against the probe without the path, as a baseline.
Every wait is bounded by the budget; a measure that does not fit is named as not measured.
Bad input (nothing listening, a page that is not the probe, a front door whose upstream
keeps no records) is a `FingerprintError` with one line that says what to do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import ssl
import struct
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from middlebox import compose
from middlebox.run.processes import UpstreamProcess, UpstreamStartError
from middlebox.scenario import fingerprint as measures
from middlebox.scenario import fit, probe_shape
from middlebox.scenario.canary import CANARY_HOLD
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.fingerprint import (
    ACCEL,
    ACCEPT_GZIP,
    COMPRESS,
    HOLD_A,
    HOLD_B,
    LAST_EVENT_ID,
    SSE_FIELDS,
    Read,
    Response,
)
from middlebox.scenario.probe_shape import Plan, ProbeShape

READ_SIZE = 65536
RECORD_WAIT = 5.0  # seconds for the probe's record to say the response ended
LEAVE_WAIT = 5.0  # seconds a client's leave is watched for at the probe
LEAVE_AFTER_FRAMES = 5
IDLE_MIN = 2.0  # seconds: a shorter silence would say nothing a hold does not
IDLE_SLACK = 3.0  # seconds of the budget kept for the silence's record and a slow path

LEAVE = ProbeShape(frames=250, size=256, period=0.02)
CHECK = ProbeShape(frames=3, size=256, period=0.01)
# The hold of a body that could not be decoded (a coding this side cannot read).
UNDECODED: dict[str, Any] = {"release": "incomplete", "bursts": [], "first_frame_wait": None,
                             "max_wait": None, "complete": False}  # fmt: skip


class FingerprintError(Exception):
    """Bad input or a path that cannot be measured: one line saying what to do."""


@dataclass(frozen=True)
class Target:
    """A base URL taken apart: where to connect and the path prefix of its routes."""

    url: str
    scheme: str
    host: str
    port: int
    prefix: str  # without a trailing slash: `/v1`, `/probe-llm/v1`, or ``

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FingerprintError(
                f"{url}: expected an http:// or https:// base URL, e.g. http://127.0.0.1:8000/v1"
            )
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise FingerprintError(f"{url}: the port is not a number") from None
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/chat/completions"):
            prefix = prefix[: -len("/chat/completions")]
        return cls(url, parts.scheme, parts.hostname, port, prefix)

    @property
    def chat(self) -> str:
        return self.prefix + ("" if self.prefix.endswith("/v1") else "/v1") + "/chat/completions"

    def records(self, ident: str) -> str:
        return f"{self.prefix}/probe/requests/{ident}"

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return name if self.port == default else f"{name}:{self.port}"

    def connect(self, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as error:
            reason = error.strerror or str(error)
            raise FingerprintError(
                f"cannot connect to {self.url} ({reason}): check the URL, and that the path "
                f"in front of `middlebox probe-upstream` is up"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.scheme == "http":
            return sock
        try:
            return ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as error:
            sock.close()
            raise FingerprintError(
                f"{self.url}: its TLS certificate is not trusted ({error.verify_message}): "
                f"add its CA to the system's store (or SSL_CERT_FILE)"
            ) from None
        except (ssl.SSLError, OSError) as error:
            sock.close()
            raise FingerprintError(f"{self.url}: TLS failed ({error})") from None


@dataclass
class Exchange:
    """One probe request through a target: what was sent, the reads, the plan."""

    shape: ProbeShape
    sent_headers: list[list[str]]
    reads: list[Read]
    response: Response
    sent_wall: float
    closed_wall: float | None  # when the client closed early (a leave), else None
    # how the path ended the connection: `fin`, `rst`, or `open` (the client stopped
    # first), and when (seconds after the request was sent)
    ended: str = "open"
    ended_at: float | None = None


def _sent_headers(request: bytes) -> list[list[str]]:
    head = request.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return [[n.strip(), v.strip()] for n, _, v in (line.partition(":") for line in head)]


def _receive(
    sock: socket.socket, deadline: float, resets: list[bool] | None = None
) -> bytes | None:
    """The next bytes; b"" when the peer closed or reset (the response ends there; a
    reset is noted in `resets`), None when `deadline` (monotonic) passed first."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    sock.settimeout(left)
    try:
        return sock.recv(READ_SIZE)
    except TimeoutError:
        return None
    except OSError as error:
        if resets is not None:
            resets.append(isinstance(error, ConnectionResetError))
        return b""


def exchange(
    target: Target,
    shape: ProbeShape,
    *,
    limit: float,
    leave_after: int | None = None,
    reset: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
) -> Exchange:
    """Send `shape` (with the request `headers`) and read to the end (or `limit` seconds);
    `leave_after`: close once that many frames' bytes of body arrived, or at a tenth of
    `limit`, as a user who stops reading; `reset`: that close is an RST (SO_LINGER 0, as a
    killed process with unread data closes, RFC 2525 §2.17), not a FIN."""
    request = probe_shape.request_for(
        shape, host=target.host_header, path=target.chat, extra_headers=headers
    )
    reads: list[Read] = []
    decoder = measures.Decoder()
    closed: float | None = None
    sock = target.connect(min(limit, 10.0))
    with sock:
        start, wall = time.monotonic(), time.time()
        sock.sendall(request)
        deadline = start + (limit / 10 if leave_after is not None else limit)
        ended = False
        resets: list[bool] = []
        ended_at: float | None = None
        while (data := _receive(sock, deadline, resets)) is not None:
            if not data:
                ended = True
                ended_at = round(time.monotonic() - start, 6)
                break
            read = Read(round(time.monotonic() - start, 6), data)
            reads.append(read)
            response = decoder.feed(read)
            if response.complete and leave_after is None:
                break  # a kept-alive connection: the message's end is the end
            if leave_after is not None and response.body.count(b"data: ") >= leave_after:
                break
        if leave_after is not None and not ended:
            if reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            closed = time.time()
    response = decoder.eof() if ended else decoder.response
    how = ("rst" if any(resets) else "fin") if ended else "open"
    return Exchange(shape, _sent_headers(request), reads, response, wall, closed, how, ended_at)


def _get_json(target: Target, path: str, limit: float) -> tuple[int | None, Any]:
    """GET `path` through the target; (status, the JSON body or None)."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {target.host_header}\r\nAccept: application/json\r\n"
        f"Connection: close\r\n\r\n"
    ).encode("latin-1")
    reads: list[Read] = []
    deadline = time.monotonic() + limit
    with target.connect(limit) as sock:
        sock.sendall(request)
        while data := _receive(sock, deadline):
            reads.append(Read(0.0, data))
    response = measures.decode(reads, method="GET")
    try:
        return response.status, json.loads(bytes(response.body))
    except ValueError:
        return response.status, None


def settled_record(target: Target, ident: str, *, limit: float, until_left: bool = False
                   ) -> dict[str, Any]:  # fmt: skip
    """The probe's record of `ident` once its response ended (or, `until_left`, once it
    learned the client left), read through the front door; the last one read when
    `limit` runs out."""
    deadline = time.monotonic() + limit
    record: dict[str, Any] | None = None
    while True:
        status, found = _get_json(target, target.records(ident), max(limit, 1.0))
        if status != 200 or not isinstance(found, dict) or "writes" not in found:
            raise FingerprintError(
                f"{target.url}: no probe record at {target.records(ident)} (got "
                f"{status or 'no answer'}): is this front door backed by `middlebox "
                f"probe-upstream`, and does it route .../probe/requests/ID? (docs/fingerprint.md)"
            )
        record = found
        done = record["ended"] != "in-progress"
        if (until_left and record["client_left"] is not None) or (done and not until_left):
            return record
        if done or time.monotonic() >= deadline:
            return record
        time.sleep(0.05)  # the probe's progress, polled


def _plan(shape: ProbeShape, record: dict[str, Any]) -> Plan:
    """The probe's plan for the request as it arrived (its HTTP version decides framing)."""
    http10 = record["request"]["version"] == "HTTP/1.0"
    connection = ", ".join(
        v.lower() for n, v in record["request"]["headers"] if n.lower() == "connection"
    )
    # RFC 9112 §9.3: HTTP/1.1 stays open unless `close`; HTTP/1.0 only with `keep-alive`
    keep = "keep-alive" in connection if http10 else "close" not in connection
    model = json.loads(record["request"]["body"] or "{}").get("model", "middlebox-probe")
    return probe_shape.plan(shape, http10=http10, ident=record["id"], model=model, keep_alive=keep)


def _check_answer(target: Target, response: Response) -> None:
    """A front door that answers something else than the probe's stream: what it said."""
    kind = response.header("content-type") or "no content type"
    if response.status is None:
        raise FingerprintError(
            f"{target.url}: no HTTP answer to POST {target.chat}: is this an HTTP front door?"
        )
    if response.status != 200 or not kind.startswith("text/event-stream"):
        raise FingerprintError(
            f"{target.url}: POST {target.chat} answered {response.status} ({kind}), not the "
            f"probe's event stream: give the OpenAI base URL whose upstream is `middlebox "
            f"probe-upstream` (e.g. http://HOST:PORT/v1)"
        )


class Session:
    """One fingerprint: the target, the budget, the progress line, the ids."""

    def __init__(
        self, target: Target, budget: float, progress: Callable[[str], None], run: str
    ) -> None:
        self.target, self.progress, self.run = target, progress, run
        self.deadline = time.monotonic() + budget
        self.serial = 0
        self.not_measured: list[str] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def fits(self, what: str, *shapes: ProbeShape) -> bool:
        # each shape, its record, and a slack for a loaded path
        if self.left() >= sum(shape.duration * 2 + 2.0 for shape in shapes):
            return True
        self.not_measured.append(f"{what} (the budget ran out)")
        return False

    def send(
        self,
        shape: ProbeShape,
        what: str,
        *,
        leave_after: int | None = None,
        reset: bool = False,
        headers: tuple[tuple[str, str], ...] = (),
        check: bool = True,
    ) -> tuple[Exchange, dict[str, Any], Plan]:
        self.serial += 1
        ident = f"{self.run}-{self.serial}"
        self.progress(f"measuring {what} ({shape.render()})")
        shape = dataclasses.replace(shape, id=ident)
        # a slow path's share: three times a short shape, a few seconds past a long one
        limit = max(min(shape.duration * 3 + 2.0, shape.duration + 5.0), 3.0)
        try:
            done = exchange(self.target, shape, limit=limit, leave_after=leave_after,
                            reset=reset, headers=headers)  # fmt: skip
        except OSError as error:  # a reset or a refusal once measuring began
            reason = error.strerror or type(error).__name__
            raise FingerprintError(
                f"{self.target.url}: the connection failed while measuring {what} ({reason}): "
                f"run again; if it repeats, the path refuses the probe's requests"
            ) from None
        if leave_after is None and check:
            _check_answer(self.target, done.response)
        record = settled_record(
            self.target, ident, limit=LEAVE_WAIT if leave_after else RECORD_WAIT,
            until_left=leave_after is not None,
        )  # fmt: skip
        return done, record, _plan(shape, record)


def _hold(
    session: Session, shape: ProbeShape, what: str, headers: tuple[tuple[str, str], ...] = ()
) -> tuple[dict[str, Any] | None, Response]:
    """The hold of `shape` (on the decoded body when the path compressed it; None when it
    cannot be decoded) and the response."""
    done, record, plan = session.send(shape, what, headers=headers)
    body = measures.decoded(done.response)
    if body is None:
        return None, done.response
    frames = record["writes"]["frames"]
    return measures.hold(plan, frames, body, period=shape.period), done.response


def _leave(session: Session, *, reset: bool) -> dict[str, Any]:
    what = "a client's reset" if reset else "a client's leave"
    gone, record, _ = session.send(LEAVE, what, leave_after=LEAVE_AFTER_FRAMES, reset=reset)
    closed = gone.closed_wall if gone.closed_wall is not None else time.time()
    return measures.leave(record, closed - record["received_at"], LEAVE_WAIT)


def measure(
    target: Target,
    budget: float,
    progress: Callable[[str], None],
    like: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Every measure that fits in `budget` seconds, as the fingerprint document's part
    for one target. With `like` (another target's measures), a long wait that target did
    not take is not taken here either, so the budget goes to the ones it did: a playback
    measures what the path measured."""
    session = Session(target, budget, progress, f"fp{uuid.uuid4().hex[:8]}")
    found: dict[str, Any] = {}
    check, record, plan = session.send(CHECK, "the request and response heads")
    found["framing"] = measures.framing(record, plan, check.response)
    found["request_headers"] = measures.header_changes(
        check.sent_headers, record["request"]["headers"]
    )
    found["response_headers"] = measures.header_changes(
        measures.planned_headers(plan), [list(f) for f in check.response.headers]
    )
    if session.fits("hold", HOLD_A, HOLD_B):
        first = _hold(session, HOLD_A, "hold, 256-byte frames")[0] or UNDECODED
        second = _hold(session, HOLD_B, "hold, 512-byte frames")[0] or UNDECODED
        held: dict[str, Any] = {
            "release": measures.release(first, second), "shapes": [first, second]
        }  # fmt: skip
        held_once = first["release"] not in ("none", "incomplete")
        if held_once and session.fits("X-Accel-Buffering: no", ACCEL):
            knob = _hold(session, ACCEL, "X-Accel-Buffering: no")[0] or UNDECODED
            held["x_accel_buffering_honoured"] = measures.accel_honoured(first, knob)
            held["shapes"].append(knob)
        found["hold"] = held
    if session.fits("compression", COMPRESS):
        squeezed, asked = _hold(session, COMPRESS, "compression (Accept-Encoding: gzip)",
                                ACCEPT_GZIP)  # fmt: skip
        found["compression"] = measures.compression(check.response, asked, squeezed)
    if session.fits("the SSE fields", SSE_FIELDS):
        sse, record, plan = session.send(
            SSE_FIELDS, "heartbeats, retry:, id: and Last-Event-ID",
            headers=(("Last-Event-ID", LAST_EVENT_ID),),
        )  # fmt: skip
        found["sse_fields"] = measures.sse_fields(plan, record, sse.response, LAST_EVENT_ID)
    if session.fits("the heads again", CHECK):
        # seconds after the first: a per-request id, and a Date, differ by now
        again, record, plan = session.send(CHECK, "the heads again (values per request)")
        for side, changes in (
            ("request_headers", measures.header_changes(
                again.sent_headers, record["request"]["headers"])),
            ("response_headers", measures.header_changes(
                measures.planned_headers(plan), [list(f) for f in again.response.headers])),
        ):  # fmt: skip
            found[side]["varying"] = measures.varying(found[side], changes)
    for reset, key in ((False, "leave"), (True, "leave_rst")):
        if session.left() >= LEAVE_WAIT + 3.0:
            found[key] = _leave(session, reset=reset)
        else:
            kind = "reset" if reset else "leave"
            session.not_measured.append(f"a client's {kind} (the budget ran out)")
    # the three long measures share what is left, each reported "at least" its length when
    # nothing ends it; one that ends early leaves its time to the next
    long_measures = (
        ("head_idle", 3, measures.head_idle_shape, measures.head_idle,
         "the timeout before the head"),
        ("duration_cap", 2, measures.cap_shape, measures.duration_cap, "a duration cap"),
    )  # fmt: skip
    for key, share, shape_of, read, what in long_measures:
        if like is not None and key not in like:
            continue  # a playback takes the long waits the path took, as long as it took them
        length = min((session.left() - share * IDLE_SLACK) / share, probe_shape.MAX_WAIT)
        if like is not None:
            length = playback_wait(like[key])
        if length < IDLE_MIN:
            session.not_measured.append(f"{what} (the budget ran out)")
            continue
        shape = shape_of(round(length, 1))
        done, record, _ = session.send(shape, f"{what} (a {length:.0f} s wait)", check=False)
        # the head's delay for the wait before the head, the stream's length for the cap
        waited = shape.head_delay or shape.duration
        found[key] = read(record, done.response, done.ended, done.ended_at, waited)
    # the silence takes what the budget has left: a longer timeout is "at least" that
    pause = min(session.left() - IDLE_SLACK, probe_shape.MAX_WAIT)
    if like is not None:  # the path's silence, as long; none when it took none
        pause = playback_wait(like["idle"]) if "idle" in like else 0.0
    if like is not None and "idle" not in like:
        pass
    elif pause >= IDLE_MIN:
        shape = measures.idle_shape(round(pause, 1))
        silent, record, _ = session.send(shape, f"the read timeout (a {pause:.0f} s silence)")
        found["idle"] = measures.idle(record, silent.response, shape.pause)
    else:
        session.not_measured.append("the read timeout after the head (the budget ran out)")
    return {"measures": found, "not_measured": session.not_measured}


def canary(target: Target, budget: float, progress: Callable[[str], None], run: str
           ) -> dict[str, Any]:  # fmt: skip
    """The canary's small grid (`middlebox fingerprint --watch`): the hold of one shape and
    one client's leave, as the same measures the whole grid takes; `leave` is None when
    `budget` had no room for it."""
    session = Session(target, budget, progress, run)
    held = _hold(session, CANARY_HOLD, "hold, 256-byte frames")[0] or UNDECODED
    left = _leave(session, reset=False) if session.left() >= LEAVE_WAIT + 1.0 else None
    return {"hold": held, "leave": left}


def playback_wait(found: Mapping[str, Any]) -> float:
    """How long a playback waits for a long measure the path took: as long as the path's
    wait when nothing cut it (so both say "at least" the same), else long enough to see
    the same cut (its time, a quarter more and half a second), whatever its budget left:
    a playback that cannot take what the path took compares nothing."""
    if not found.get("cut"):
        return min(float(found["at_least"]), probe_shape.MAX_WAIT)
    at = float(found.get("timeout", found.get("limit", 0.0)))
    return min(at * 1.25 + 0.5, probe_shape.MAX_WAIT)


def fingerprint(
    url: str,
    *,
    direct: str | None = None,
    budget: float = 60.0,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The fingerprint document of the path at `url` (and of `direct`, the probe without
    the path, when given), each measure with its value and uncertainty."""
    target = Target.parse(url)
    baseline = Target.parse(direct) if direct else None
    share = budget / 2 if baseline else budget
    document: dict[str, Any] = {"url": url, **measure(target, share, progress)}
    if baseline is not None:
        progress(f"baseline: the same measures at {direct}")
        document["direct"] = {"url": direct, **measure(baseline, share, progress)}
    document["closest_preset"] = _closest(document)
    document["summary"] = [*measures.summary(document), document["closest_preset"]["line"]]
    if baseline is not None:
        document["direct"]["summary"] = measures.summary(document["direct"])
    return document


def _write_whole(text: str, path: Path) -> None:
    """`text` at `path`, whole or not at all: written aside, then renamed; the aside file
    is removed when the write fails."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _closest(document: dict[str, Any]) -> dict[str, Any]:
    """The preset whose expected fingerprint agrees with the document's (middlebox's
    presets, as `- preset: NAME` in a scenario takes them)."""
    closest = fit.closest_preset(document["measures"], compose.PRESETS)
    return {"names": list(closest.names), "agrees": closest.agrees, "line": closest.line(),
            "rows": [dataclasses.asdict(row) for row in closest.rows]}  # fmt: skip


def write_json(document: dict[str, Any], path: Path) -> None:
    """The document at `path`, whole or not at all (a temporary file renamed)."""
    _write_whole(json.dumps(document, indent=2) + "\n", path)


# -- fit and verify ----------------------------------------------------------------------------


def fitted_scenario(document: dict[str, Any], name: str) -> tuple[str, fit.Fitted]:
    """The scenario fitted to the document's path, as YAML text that the loader accepts
    (checked here: a fitter's mistake is an error, never a file that fails later)."""
    fitted = fit.fit(document["measures"])
    text = fit.scenario_text(fitted, name=name, url=document["url"])
    try:
        compose.load_text(text, name)
    except ScenarioError as error:  # the fitter wrote what the loader refuses: a bug here
        raise FingerprintError(f"the fitted scenario does not load: {error}") from None
    return text, fitted


def write_scenario(document: dict[str, Any], path: Path) -> fit.Fitted:
    """The fitted scenario at `path` (whole or not at all); the fit goes into `document`
    (`fit`: its path and what no fault expresses)."""
    text, fitted = fitted_scenario(document, path.stem)
    document["fit"] = {"scenario": str(path), "path": fitted.path,
                       "not_fitted": fitted.not_fitted}  # fmt: skip
    try:
        _write_whole(text, path)
    except OSError as error:
        raise FingerprintError(f"{path}: cannot write ({error.strerror})") from None
    return fitted


def _listening(line: str) -> str | None:
    found = re.search(r"listening on (https?://\S+)", line)
    return found[1] if found else None


def verify_scenario(
    document: dict[str, Any],
    scenario: Path,
    *,
    budget: float,
    progress: Callable[[str], None] = lambda line: None,
) -> list[fit.Row]:
    """Play the same measures through `middlebox proxy --scenario SCENARIO` in front of a
    local probe upstream (both on loopback, each its own process, stopped at the end) and
    compare them with the document's, measure by measure; the rows go into `document`
    (`verify`)."""
    command = [sys.executable, "-m", "middlebox"]
    try:
        probe = UpstreamProcess([*command, "probe-upstream", "--port", "0"], _listening,
                                what="the probe upstream")  # fmt: skip
    except UpstreamStartError as error:
        raise FingerprintError(f"cannot verify: {error}") from None
    try:
        proxy = UpstreamProcess(
            [*command, "proxy", "--listen", "127.0.0.1:0", "--upstream", probe.url,
             "--scenario", str(scenario), "--grace", "1"],
            _listening, what=f"middlebox proxy --scenario {scenario}",
        )  # fmt: skip
        try:
            progress(f"verifying: the same measures through middlebox proxy --scenario {scenario}")
            model = measure(Target.parse(f"{proxy.url}/v1"), budget, progress,
                            like=document["measures"])  # fmt: skip
        finally:
            proxy.stop()
    except UpstreamStartError as error:
        raise FingerprintError(f"cannot verify: {error}") from None
    finally:
        probe.stop()
    path, played = fit.values(document["measures"]), fit.values(model["measures"])
    rows = fit.agreement(path, played)
    document["verify"] = {
        "scenario": str(scenario),
        "measures": model["measures"],
        "rows": [dataclasses.asdict(row) for row in rows],
        "agreed": sum(row.ok for row in rows),
        "of": len(rows),
        # a row the path has and the playback could not take is named, not dropped
        "not_played": [name for name in path if name not in played],
    }
    return rows


def fingerprint_and_fit(
    url: str,
    *,
    direct: str | None,
    budget: float,
    scenario: Path | None,
    verify: bool,
    progress: Callable[[str], None],
    say: Callable[[str], None],
) -> dict[str, Any]:
    """`middlebox fingerprint`: measure, `say` the summary; with `scenario`, write the
    fitted scenario there and say what no fault expresses; with `verify`, play the same
    measures through it and say the agreement. The document has all of it."""
    document = fingerprint(url, direct=direct, budget=budget, progress=progress)
    for line in document["summary"]:
        say(line)
    if "direct" in document:
        say("Directly, without the path:")
        for line in document["direct"]["summary"][1:]:
            say(f"  {line}")
    if scenario is None:
        return document
    fitted = write_scenario(document, scenario)
    count = len(fitted.path)
    say(f"Wrote {scenario}: a path of {count} fault{'' if count == 1 else 's'}.")
    for line in fitted.not_fitted:
        say(f"Not expressed by any fault: {line}.")
    if verify:
        rows = verify_scenario(document, scenario, budget=budget, progress=progress)
        say(f"Verified through middlebox proxy --scenario {scenario}:")
        for line in fit.agreement_lines(rows):
            say(f"  {line}")
        if document["verify"]["not_played"]:
            skipped = ", ".join(document["verify"]["not_played"])
            say(f"  Not measured in the playback (its budget ran out): {skipped}.")
    return document
