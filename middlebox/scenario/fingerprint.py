"""What a path does to a probe stream: the fingerprinter's measures, from plain data.

`middlebox fingerprint` (middlebox/tools/fingerprint.py) sends probe shapes
(probe_shape.request_for) through a path and keeps three things per request: the client's
reads (`Read`: seconds after the request was sent, and the bytes), the probe's plan (what
it wrote, byte for byte) and the probe's record (when it wrote each frame, on its own
clock, and what reached it). This module turns them into measures, each a value with its
uncertainty, without a socket or a clock, so a virtual-clock test feeds it a fault's
output (`faults.testing.replay` over `probe_shape.timeline`) and gets the same answer as
a real path:

- `hold`: the bursts the client read (reads closer than half a period are one burst),
  each burst's size in bytes of the upstream's response (its head and chunk framing
  counted, as a proxy buffer counts what it reads), and how long each frame waited
  beyond the fastest one (the path's transit). A hold is released by a buffer size (the
  bursts of two shapes with the same bytes and different periods agree in bytes), a
  timer (they agree in time) or the response's end (one burst, after the last write).
- `header_changes`: fields added, removed or changed, request (sent vs recorded) or
  response (the probe's head vs the client's).
- `framing`: the HTTP version and framing toward the upstream, and toward the client
  (re-chunked when the client's chunks are not the probe's writes).
- `leave`: how long after the client closed (a FIN, or an RST: `leave_rst`) the upstream
  learned, and the frames it wrote in between.
- `compression`: whether the path encodes the event stream for a client that sends
  `Accept-Encoding: gzip` (and for one that does not), and whether the compressed bytes
  flow per frame or are held: the hold measured on the body decoded read by read
  (`decoded`), so a frame counts as arrived when the client could decompress it.
- `sse_fields`: the `: keep-alive` comments, `retry:` and `id:` lines the probe wrote
  against those that arrived, and the `Last-Event-ID` request header sent against the
  record's: passed, removed (eaten) or changed.
- `head_idle`: a hop's timeout before the response head (the probe holds its head for as
  long as the budget allows): when the client got an answer (a status page) or lost the
  connection (a reset, a close), and how.
- `duration_cap`: a steady stream (a frame every 100 ms) cut at a time, whatever flows:
  the record says when the hop closed the upstream connection.
- `idle`: a hop's read timeout after the head, from one silence as long as the budget
  allows: the record says when the hop closed the upstream connection, on the probe's
  clock, after the last frame before the silence ("at least N s" when it never did).

The timeouts are read from one wait each, not found by bisection: the record (or the
client's clock) times the cut itself, to the millisecond, so one wait as long as the
budget allows says as much as a bisection within it, in one request.

The client's and the probe's clocks are not compared directly (the probe may run on
another machine): a frame's delay is its arrival minus its write, and the smallest delay
of a stream is taken as the path's transit, so a hold is the delay beyond it.
"""

from __future__ import annotations

import itertools
import re
import statistics
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from middlebox.core.http1 import Http1Framer, PieceKind
from middlebox.scenario.probe_shape import Plan, ProbeShape

# A burst is reads closer than this share of the shape's period: a path that forwards
# every write gives one read per write, a period apart.
BURST_GAP = 0.5
# A frame delayed by less than this (seconds, beyond the transit) is not held: scheduling
# on a loaded 2-core machine delays single writes by a few milliseconds.
HOLD_FLOOR = 0.015
# A stream is held when at least this share of its frames wait: a hold makes most frames
# wait (all but the one that fills a buffer), a client descheduled for 50 ms a few.
HELD_SHARE = 0.2

# The hold shapes: the same length (~1 s), the second twice the bytes per second, so a
# buffer's bursts keep their size and a timer's their interval (`release`); the third is
# the first with the knob that asks nginx-like hops not to buffer.
HOLD_A = ProbeShape(frames=48, size=256, period=0.02)
HOLD_B = ProbeShape(frames=48, size=512, period=0.02)
ACCEL = ProbeShape(frames=48, size=256, period=0.02, headers=(("X-Accel-Buffering", "no"),))
# Compression: the 256-byte hold shape asked with `Accept-Encoding: gzip` (nginx's gzip
# filter, like most, compresses only for a client that accepts it: ngx_http_gzip_ok).
COMPRESS = HOLD_A
ACCEPT_GZIP = (("Accept-Encoding", "gzip"),)
# The SSE fields: frames with `id:` lines, a `retry:` field after the head, and a pause with
# `: keep-alive` comments (three of them) between frames 2 and 3; asked with a
# `Last-Event-ID` request header, as a reconnecting EventSource sends it (WHATWG HTML,
# server-sent events).
SSE_FIELDS = ProbeShape(
    frames=4, size=256, period=0.02, pause_after=2, pause=0.35, heartbeat=0.1, retry=2.5,
    event_ids=True,
)  # fmt: skip
LAST_EVENT_ID = "probe-7"


@dataclass(frozen=True)
class Read:
    """One read of the client: `at` seconds after its request was sent."""

    at: float
    data: bytes


@dataclass
class Response:
    """The client's reads decoded: the head, the framing, the body (chunk framing
    removed) and `body_at`, the body bytes received by the end of each read."""

    status: int | None = None
    version: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    head_at: float | None = None
    framing: str = "none"  # chunked, length, close
    chunks: int = 0
    body: bytearray = field(default_factory=bytearray)
    body_at: list[tuple[float, int]] = field(default_factory=list)
    complete: bool = False

    def header(self, name: str) -> str | None:
        found = [v for n, v in self.headers if n.lower() == name.lower()]
        return ", ".join(found) if found else None


class Decoder:
    """A response decoded read by read (`feed`, then `eof` when the peer closed)."""

    def __init__(self, method: str = "POST") -> None:
        self.framer = Http1Framer("response")
        self.framer.expect_response_to(method)
        self.response = Response()
        self.last = 0.0

    def feed(self, read: Read) -> Response:
        self.last = read.at
        _take(self.response, self.framer.feed(read.data), read.at)
        return self.response

    def eof(self) -> Response:
        _take(self.response, self.framer.feed_eof(), self.last)
        return self.response


def decode(reads: Sequence[Read], *, ended: bool = True, method: str = "POST") -> Response:
    """The response in `reads` (`ended`: the peer closed after the last one)."""
    decoder = Decoder(method)
    for read in reads:
        decoder.feed(read)
    return decoder.eof() if ended else decoder.response


def _take(response: Response, pieces: Sequence[Any], at: float) -> None:
    grew = False
    for piece in pieces:
        if piece.message > 0:
            continue  # one response per connection is read
        if piece.kind is PieceKind.HEAD and piece.head is not None:
            if piece.head.is_interim:
                continue
            head = piece.head
            response.status, response.version = head.status, head.version
            response.headers, response.head_at = head.headers, at
            encoding = (head.header("transfer-encoding") or "").lower()
            response.framing = (
                "chunked"
                if "chunked" in encoding
                else "length"
                if head.header("content-length") is not None
                else "close"
            )
        elif piece.kind is PieceKind.CHUNK_HEADER:
            response.chunks += 1
        elif piece.kind is PieceKind.BODY and piece.data:
            response.body += piece.data
            grew = True
        if piece.end_of_message:
            response.complete = True
    if grew:
        response.body_at.append((at, len(response.body)))


# -- the upstream's side, from the plan -------------------------------------------------------


def _payload(data: bytes, chunked: bool) -> bytes:
    if not chunked:
        return data
    size, _, rest = data.partition(b"\r\n")
    return rest[: int(size, 16)] if size.strip() else b""


@dataclass(frozen=True)
class Upstream:
    """The plan as offsets: for each write, where its payload starts in the body and where
    its bytes start on the upstream's wire (the head first)."""

    head_bytes: int
    writes: tuple[tuple[int, int, int, int], ...]  # body start, payload, wire start, header
    frame_ends: tuple[int, ...]  # body offset after each frame
    body_bytes: int

    @classmethod
    def of(cls, plan: Plan) -> Upstream:
        chunked = plan.framing == "chunked"
        head = plan.writes[0].data
        wire, body = len(head), 0
        writes, ends = [], []
        for write in plan.writes[1:]:
            payload = _payload(write.data, chunked)
            header = write.data.find(payload) if payload else 0
            writes.append((body, len(payload), wire, header))
            body += len(payload)
            wire += len(write.data)
            if write.kind == "frame":
                ends.append(body)
        return cls(len(head), tuple(writes), tuple(ends), body)

    def wire_at(self, body_offset: int) -> int:
        """Bytes of the upstream's response (head, framing, payload) up to body byte
        `body_offset`."""
        if body_offset <= 0:
            return self.head_bytes
        for start, size, wire, header in self.writes:
            if body_offset <= start + size:
                return wire + header + (body_offset - start)
        last = self.writes[-1]
        return last[2] + last[3] + last[1]


# -- hold -------------------------------------------------------------------------------------


def _arrival(response: Response, body_offset: int) -> float | None:
    for at, received in response.body_at:
        if received >= body_offset:
            return at
    return None


def hold(
    plan: Plan, frame_writes: Sequence[float], response: Response, *, period: float
) -> dict[str, Any]:
    """How the path held one stream: its bursts (start, end in seconds, bytes of the
    upstream's response), each frame's wait beyond the transit, and `release`: `none`
    (fewer than HELD_SHARE of the frames wait), `end` (one burst after the last write),
    `periodic` (bursts before the end: a size or a timer, which `release` of two shapes
    tells apart), or `incomplete` (the body did not all arrive)."""
    upstream = Upstream.of(plan)
    bursts: list[list[float]] = []  # [start, end, body end]
    gap = max(period * BURST_GAP, 0.001)
    for at, received in response.body_at:
        if bursts and at - bursts[-1][1] < gap:
            bursts[-1][1], bursts[-1][2] = at, received
        else:
            bursts.append([at, at, received])
    sizes: list[int] = []
    before = 0
    for burst in bursts:
        wire = upstream.wire_at(int(burst[2]))
        sizes.append(wire - before)
        before = wire
    delays = []
    for index, end in enumerate(upstream.frame_ends):
        arrived = _arrival(response, end)
        if arrived is None or index >= len(frame_writes):
            break
        delays.append(arrived - frame_writes[index])
    transit = min(delays) if delays else 0.0
    waits = [round(delay - transit, 6) for delay in delays]
    complete = len(response.body) >= upstream.body_bytes
    last_write = frame_writes[-1] if frame_writes else 0.0
    if not complete or not delays:
        release = "incomplete"
    elif sum(w >= max(HOLD_FLOOR, period / 2) for w in waits) < HELD_SHARE * len(waits):
        release = "none"
    elif len(bursts) == 1 or (bursts[0][0] - transit >= last_write - period / 2):
        release = "end"
    else:
        release = "periodic"
    # the bursts before the end's: the releases a buffer or a timer made
    middle = sizes[:-1] if release == "periodic" else []
    starts = [burst[0] for burst in bursts[:-1]] if release == "periodic" else []
    return {
        "release": release,
        "bursts": [{"at": round(b[0], 4), "bytes": s} for b, s in zip(bursts, sizes, strict=True)],
        "burst_bytes": _spread([float(s) for s in middle]),
        "burst_interval": _spread([b - a for a, b in itertools.pairwise(starts)]),
        "frame_wire_bytes": upstream.wire_at(upstream.frame_ends[0]) - upstream.head_bytes
        if upstream.frame_ends
        else 0,
        "total_bytes": upstream.wire_at(upstream.body_bytes),
        "max_wait": round(max(waits), 4) if waits else None,
        "first_frame_wait": waits[0] if waits else None,
        "transit": round(transit, 4),
        "frames_arrived": len(delays),
        "complete": complete,
    }


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    """The median and half the range (the uncertainty), or None without values."""
    if not values:
        return None
    middle = statistics.median(values)
    return {"value": round(middle, 4), "uncertainty": round((max(values) - min(values)) / 2, 4)}


def release(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """What releases a hold, from two shapes of which the second sends twice the bytes per
    second: bursts equal in bytes are a buffer size, equal in time a timer. A buffer's
    uncertainty is at least one frame of the larger shape (a release lands on a write)."""
    kinds = {first["release"], second["release"]}
    if kinds == {"none"}:
        return {"held": False, "by": "nothing"}
    if "incomplete" in kinds:
        return {"held": None, "by": "unknown: a stream did not arrive whole"}
    if kinds == {"end"}:
        most = max(first["total_bytes"], second["total_bytes"])
        return {"held": True, "by": "end", "at_least_bytes": most}
    if kinds == {"end", "periodic"}:
        # a buffer larger than the smaller shape's whole response
        shape = first if first["release"] == "periodic" else second
        if shape["burst_bytes"]:
            sized = shape["burst_bytes"]
            spread = max(shape["frame_wire_bytes"], sized["uncertainty"])
            return {"held": True, "by": "size", "bytes": round(sized["value"]),
                    "uncertainty": spread}  # fmt: skip
    a, b = first["burst_bytes"], second["burst_bytes"]
    ta, tb = first["burst_interval"], second["burst_interval"]
    if "periodic" in kinds and a and b:
        resolution = max(first["frame_wire_bytes"], second["frame_wire_bytes"])
        # the second shape sends twice the bytes per second: a buffer's bursts keep their
        # bytes and halve their interval, a timer's keep their interval and double in bytes
        bytes_agree = abs(a["value"] - b["value"]) <= resolution + a["uncertainty"]
        time_agree = bool(ta and tb) and abs(ta["value"] - tb["value"]) <= 0.25 * (
            ta["value"] + tb["value"]
        ) / 2 + max(ta["uncertainty"], tb["uncertainty"])
        if bytes_agree and not time_agree:
            # a hop that releases whole reads rounds its buffer up to a write: the size
            # lies within one frame of the smaller shape below the bursts
            size = (a["value"] + b["value"]) / 2
            finest = min(first["frame_wire_bytes"], second["frame_wire_bytes"])
            spread = max(finest, abs(a["value"] - b["value"]) / 2, a["uncertainty"])
            return {"held": True, "by": "size", "bytes": round(size), "uncertainty": spread}
        if time_agree and not bytes_agree:
            assert ta is not None and tb is not None
            interval = (ta["value"] + tb["value"]) / 2
            spread = max(ta["uncertainty"], tb["uncertainty"], abs(ta["value"] - tb["value"]) / 2)
            return {"held": True, "by": "timer", "seconds": round(interval, 4),
                    "uncertainty": round(spread, 4)}  # fmt: skip
    return {"held": True, "by": "irregular"}


def accel_honoured(plain: Mapping[str, Any], with_knob: Mapping[str, Any]) -> bool | None:
    """Whether `X-Accel-Buffering: no` on the response turned a hold off (None: the path
    holds nothing, so there is nothing to turn off)."""
    if plain["release"] in ("none", "incomplete"):
        return None
    return bool(with_knob["release"] == "none")


# -- compression -------------------------------------------------------------------------------

# Content codings this module decodes (RFC 9110 §8.4.1): zlib's window bits for each.
_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def coding(response: Response) -> str | None:
    """The response's content coding (lower case), None for identity."""
    found = (response.header("content-encoding") or "").strip().lower()
    return None if found in ("", "identity") else found


def decoded(response: Response) -> Response | None:
    """`response` with its body decoded read by read (`body_at` in decoded bytes: what a
    client could parse by the end of each read); itself when not encoded, None for a
    coding this module cannot decode (br, zstd) or a body that is not that coding."""
    name = coding(response)
    if name is None:
        return response
    if name not in _CODINGS:
        return None
    inflate = zlib.decompressobj(_CODINGS[name])
    out = Response(response.status, response.version, response.headers, response.head_at,
                   response.framing, response.chunks, complete=response.complete)  # fmt: skip
    before = 0
    try:
        for at, received in response.body_at:
            out.body += inflate.decompress(bytes(response.body[before:received]))
            before = received
            out.body_at.append((at, len(out.body)))
    except zlib.error:
        return None
    return out


def compression(
    unasked: Response, asked: Response, held: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Whether the path compresses the event stream: `unasked` is a response to a request
    without Accept-Encoding, `asked` one to a request with `Accept-Encoding: gzip`, `held`
    the hold measured on `asked`'s decoded body (None when it could not be decoded).
    `flush`: `per-frame` when every frame was decodable as it was written (the hop flushes
    its compressor per upstream read: nginx under `proxy_buffering off`), `held` when
    frames waited (the compressor's buffer, or a hold beside it), `unknown` otherwise."""
    found: dict[str, Any] = {"asked": coding(asked), "unasked": coding(unasked)}
    found["compresses"] = found["asked"] is not None or found["unasked"] is not None
    if found["asked"] is None:
        return found
    if held is None or held["release"] == "incomplete":
        found["flush"] = "unknown"
        return found
    found["flush"] = "per-frame" if held["release"] == "none" else "held"
    found["release"] = held["release"]
    found["bursts"] = len(held["bursts"])
    found["first_frame_wait"] = held["first_frame_wait"]
    found["max_wait"] = held["max_wait"]
    return found


# -- SSE fields: heartbeats, retry, id, Last-Event-ID -------------------------------------------

_LINE_END = re.compile(rb"\r\n|\r|\n")


def _field_values(body: bytes, name: bytes) -> list[str]:
    """The values of every `name:` line of an event stream (one leading space dropped, as
    the WHATWG parser drops it)."""
    found = []
    for line in _LINE_END.split(body):
        if line.startswith(name + b":"):
            value = line[len(name) + 1 :]
            found.append(value[1:] if value.startswith(b" ") else value)
    return [value.decode("latin-1") for value in found]


def _verdict(sent: Sequence[str], arrived: Sequence[str]) -> str:
    if list(sent) == list(arrived):
        return "passed"
    return "removed" if not arrived else "changed"


def sse_fields(
    plan: Plan, record: Mapping[str, Any], response: Response, last_event_id: str
) -> dict[str, Any]:
    """What the path did to the SSE fields of `plan` (heartbeat comments, `retry:` and `id:`
    lines) and to the `Last-Event-ID` request header sent as `last_event_id`, each
    `passed`, `removed` or `changed` (`eaten` or `some` for heartbeats), with what was sent
    and what arrived; `body` None when the response could not be decoded."""
    body = decoded(response)
    sent_body = b"".join(_payload(w.data, plan.framing == "chunked") for w in plan.writes[1:])
    arrived_ids = [v for n, v in record["request"]["headers"] if n.lower() == "last-event-id"]
    header = {
        "sent": last_event_id,
        "arrived": arrived_ids[0] if arrived_ids else None,
        "verdict": _verdict([last_event_id], arrived_ids),
    }
    if body is None:
        return {"decoded": False, "last_event_id": header}
    sent_beats = sum(1 for line in _LINE_END.split(sent_body) if line.startswith(b":"))
    beats = sum(1 for line in _LINE_END.split(bytes(body.body)) if line.startswith(b":"))
    found: dict[str, Any] = {
        "decoded": True,
        "heartbeats": {
            "sent": sent_beats,
            "arrived": beats,
            "verdict": "passed" if beats >= sent_beats else "eaten" if beats == 0 else "some",
        },
        "last_event_id": header,
    }
    for name in ("retry", "id"):
        sent = _field_values(sent_body, name.encode())
        arrived = _field_values(bytes(body.body), name.encode())
        found[name] = {"sent": sent, "arrived": arrived, "verdict": _verdict(sent, arrived)}
    found["complete"] = b"data: [DONE]" in body.body
    return found


# -- headers and framing ----------------------------------------------------------------------


def _fields(headers: Sequence[Sequence[str]]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for name, value in headers:
        key = name.lower()
        if key in found:
            found[key] = (found[key][0], f"{found[key][1]}, {value}")
        else:
            found[key] = (name, value)
    return found


def header_changes(
    sent: Sequence[Sequence[str]], arrived: Sequence[Sequence[str]]
) -> dict[str, list[list[str]]]:
    """Fields `added` ([name, value]), `removed` ([name, value]) and `changed` ([name,
    sent value, arrived value]); names compared case-insensitively."""
    before, after = _fields(sent), _fields(arrived)
    return {
        "added": [list(after[k]) for k in after if k not in before],
        "removed": [list(before[k]) for k in before if k not in after],
        "changed": [
            [after[k][0], before[k][1], after[k][1]]
            for k in after
            if k in before and before[k][1] != after[k][1]
        ],
    }


def varying(
    first: Mapping[str, Sequence[Sequence[str]]], again: Mapping[str, Sequence[Sequence[str]]]
) -> list[list[str]]:
    """The fields a hop added or changed whose value differs on a second request ([name,
    first value, second value]; the second empty when it was not there): a transaction id
    (Varnish's `X-Varnish`), a `Date` a second or more later, a cache's `Age`. Names compared
    case-insensitively; a field the hop writes the same each time is not listed."""
    later = {n.lower(): v for n, v in again.get("added", [])}
    later |= {n.lower(): v for n, _sent, v in again.get("changed", [])}
    written = [(n, v) for n, v in first.get("added", [])]
    written += [(n, v) for n, _sent, v in first.get("changed", [])]
    return [[n, v, later.get(n.lower(), "")] for n, v in written if later.get(n.lower()) != v]


def planned_headers(plan: Plan) -> list[list[str]]:
    """The header fields of the probe's response head in `plan`."""
    lines = plan.writes[0].data.decode("latin-1").split("\r\n")[1:]
    return [[n.strip(), v.strip()] for n, _, v in (x.partition(":") for x in lines) if n]


def framing(record: Mapping[str, Any], plan: Plan, response: Response) -> dict[str, Any]:
    """The version and framing toward the upstream (the record) and toward the client,
    and whether the client's chunks are the probe's writes (`rechunked`)."""
    upstream_chunks = sum(1 for w in plan.writes[1:] if w.data and w.kind != "last-chunk")
    same = response.framing == plan.framing and (
        plan.framing != "chunked" or response.chunks == upstream_chunks
    )
    return {
        "upstream_version": record["request"]["version"],
        "upstream_framing": record["framing"],
        "client_version": response.version,
        "client_framing": response.framing,
        "client_chunks": response.chunks,
        "upstream_chunks": upstream_chunks if plan.framing == "chunked" else None,
        "rechunked": not same,
    }


# -- a client's leave -------------------------------------------------------------------------


def leave(record: Mapping[str, Any], closed_at: float, waited: float) -> dict[str, Any]:
    """What a client's close did: `closed_at` is when it closed, in seconds after the
    probe received the request (the wall clocks of both sides, so the uncertainty is
    their offset); `waited` how long the record was watched after it."""
    left = record.get("client_left")
    writes = record["writes"]["frames"]
    before = sum(1 for at in writes if at <= closed_at)
    if left is None:
        return {"learned": False, "at_least": round(waited, 3), "frames_after_close":
                record["frames_written"] - before}  # fmt: skip
    return {
        "learned": True,
        "how": left["how"],
        "after": round(max(left["at"] - closed_at, 0.0), 4),
        "frames_after_close": max(left["frames_written"] - before, 0)
        + record.get("frames_after_leave", 0),
    }


# -- an idle timeout -------------------------------------------------------------------------


def idle_shape(pause: float) -> ProbeShape:
    """Two frames, then silence for `pause`, then the end: a hop's read timeout shorter
    than `pause` closes the upstream connection during the silence."""
    return ProbeShape(frames=2, size=256, period=0.02, pause_after=1, pause=pause)


def idle(record: Mapping[str, Any], response: Response, pause: float) -> dict[str, Any]:
    """A hop's read timeout after the head: when the upstream connection ended during the
    silence (the record's `client_left.at`) minus the last write before it, on the probe's
    own clock; `at_least` the silence when it outlasted the pause. `client_saw`: how the
    client's response ended (`truncated`: a cut message; `complete-without-done`: a proper
    end without `data: [DONE]`, as Caddy ends it; `complete`)."""
    left = record.get("client_left")
    frames = record["writes"]["frames"]
    cut = left is not None and left["frames_written"] < 2
    saw = _client_saw(response)
    if not cut or left is None or not frames:
        return {"cut": False, "at_least": round(pause, 3), "client_saw": saw}
    return {
        "cut": True,
        "timeout": round(left["at"] - frames[0], 3),
        "cut_at": left["at"],
        "how": left["how"],
        "client_saw": saw,
    }


def _client_saw(response: Response) -> str:
    """How the client's response ended: `truncated`, `complete-without-done`, `complete`,
    or `status N` for an answer other than the probe's 200."""
    if response.status not in (None, 200):
        return f"status {response.status}"
    done = b"data: [DONE]" in response.body
    if response.complete:
        return "complete" if done else "complete-without-done"
    return "truncated"


# -- an idle timeout before the head -----------------------------------------------------------


def head_idle_shape(pause: float) -> ProbeShape:
    """The head `pause` seconds after the request (a long prefill), then two frames: a
    hop's timeout for the response head shorter than `pause` ends the exchange first."""
    return ProbeShape(frames=2, size=256, period=0.02, head_delay=pause)


def head_idle(
    record: Mapping[str, Any], response: Response, ended: str, ended_at: float | None,
    pause: float,
) -> dict[str, Any]:  # fmt: skip
    """A hop's timeout before the response head: `timeout` is when the client's answer
    came (the head of an error page) or its connection ended (`ended`: `rst` or `fin`),
    seconds after its request, on its own clock; `uncertainty` how far that is from when
    the hop closed the upstream connection (the record's `client_left.at`, on the probe's
    clock), when it did. `end`: `status N`, `reset` or `close` (a close without an
    answer). "at least" the pause when the probe's head and frames came through."""
    left = record.get("client_left")
    if response.status == 200:
        return {"cut": False, "at_least": round(pause, 3), "client_saw": _client_saw(response)}
    if response.status is not None and response.head_at is not None:
        at, end = response.head_at, f"status {response.status}"
    elif ended_at is not None:
        at, end = ended_at, "reset" if ended == "rst" else "close"
    else:  # nothing came and the connection stayed open past the client's limit
        return {"cut": False, "at_least": round(pause, 3), "client_saw": "nothing"}
    found: dict[str, Any] = {"cut": True, "timeout": round(at, 3), "end": end}
    if left is not None:
        found["upstream_closed_at"] = left["at"]
        found["uncertainty"] = round(abs(at - left["at"]), 3)
    else:
        found["uncertainty"] = None
    return found


# -- a hard duration cap ----------------------------------------------------------------------

CAP_PERIOD = 0.1  # seconds between the cap shape's frames: far below any read timeout
# A cut after a gap in the probe's writes longer than this many periods is not read as a cap
CAP_QUIET = 3


def cap_shape(length: float) -> ProbeShape:
    """A steady stream of `length` seconds, a frame every CAP_PERIOD: a hop that cuts a
    busy stream at a time (not a silence) cuts it."""
    return ProbeShape(frames=max(round(length / CAP_PERIOD), 1), size=256, period=CAP_PERIOD)


def duration_cap(
    record: Mapping[str, Any], response: Response, ended: str, ended_at: float | None,
    length: float,
) -> dict[str, Any]:  # fmt: skip
    """A hop's cap on a whole response: when it ended the steady stream, on the probe's
    clock (the record's `client_left.at`, seconds after the request), ± the frame period
    (the stream is busy: the cut lands between two writes); the client's clock when the
    upstream was never told. "at least" the stream's length when it came whole, or the
    cut's time when the probe's writes had stalled for CAP_QUIET periods before it (a read
    timeout's cut then, on a loaded machine: nginx's lazy timer fires up to 300 ms early).
    `client_saw` as `idle` says it, or `reset` (`ended`: the path reset the connection)."""
    saw = _client_saw(response)
    if saw == "complete":
        return {"cut": False, "at_least": round(length, 3), "client_saw": saw}
    if saw == "truncated" and ended == "rst":
        saw = "reset"
    left = record.get("client_left")
    if left is not None:
        at, frames = left["at"], left["frames_written"]
    elif ended_at is not None:
        at, frames = ended_at, record["frames_written"]
    else:
        return {"cut": False, "at_least": round(length, 3), "client_saw": saw}
    written = [when for when in record["writes"]["frames"] if when <= at]
    quiet = at - (written[-1] if written else 0.0)
    if quiet > CAP_QUIET * CAP_PERIOD:
        # the probe's own writes stalled (a loaded machine) before the cut: a read timeout
        # may have fired in the gap, so this cut says only that no cap fired before it
        return {"cut": False, "at_least": round(at, 3), "client_saw": saw,
                "quiet_before_cut": round(quiet, 3)}  # fmt: skip
    return {
        "cut": True,
        "limit": round(at, 3),
        "uncertainty": CAP_PERIOD,
        "frames_before": frames,
        "client_saw": saw,
    }


# -- the summary ------------------------------------------------------------------------------


def _size(value: float) -> str:
    return f"{value / 1024:.1f} KiB" if value >= 1024 else f"{value:.0f} bytes"


def _compression_line(found: Mapping[str, Any]) -> str:
    if not found["compresses"]:
        return "It does not compress the event stream (asked with Accept-Encoding: gzip)."
    unasked = (
        f" It compresses without being asked too ({found['unasked']})." if found["unasked"] else ""
    )
    if found["asked"] is None:
        return (
            f"It compresses the event stream ({found['unasked']}) only for a client that does "
            f"not send Accept-Encoding: gzip."
        )
    flush = found.get("flush", "unknown")
    if flush == "per-frame":
        said = "every frame is decodable as it is written (flushed per frame)"
    elif flush == "held":
        said = (
            f"the compressed bytes are held (the first frame {found['first_frame_wait']:.2f} s "
            f"late, {found['bursts']} burst{'s' if found['bursts'] != 1 else ''})"
        )
    else:
        said = "its flush could not be measured (the body did not decode whole)"
    return f"It compresses the event stream with {found['asked']} when asked: {said}.{unasked}"


def _sse_line(found: Mapping[str, Any]) -> str:
    header = found["last_event_id"]
    said = [f"Last-Event-ID {header['verdict']}"]
    if found["decoded"]:
        beats = found["heartbeats"]
        said.insert(0, f"heartbeats {beats['verdict']} ({beats['arrived']} of {beats['sent']})")
        for name in ("retry", "id"):
            item = found[name]
            shown = (
                f" ({', '.join(item['arrived'][:3]) or '-'})"
                if item["verdict"] == "changed"
                else ""
            )
            said.insert(-1, f"{name}: lines {item['verdict']}{shown}")
    return f"SSE fields: {'; '.join(said)}."


def summary(document: Mapping[str, Any]) -> list[str]:
    """The fingerprint in sentences, one measure a line."""
    lines = [f"Path {document['url']}:"]
    measures = document["measures"]
    held = measures.get("hold")
    if held is not None:
        by = held["release"]
        if by["by"] == "nothing":
            lines.append("It holds nothing: every frame reaches the client as it is written.")
        elif by["by"] == "size":
            lines.append(
                f"It holds ~{_size(by['bytes'])} (± {by['uncertainty']:.0f} bytes) of every "
                f"response: bursts of that size, the rest at the end; the first frame "
                f"{held['shapes'][0]['first_frame_wait']:.2f} s late."
            )
        elif by["by"] == "timer":
            lines.append(
                f"It holds the stream for ~{by['seconds']:.2f} s at a time "
                f"(± {by['uncertainty']:.2f} s): a timer releases it."
            )
        elif by["by"] == "end":
            lines.append(
                f"It holds the whole response until its end (at least "
                f"{_size(by['at_least_bytes'])}: a buffer larger than the probe's answers, "
                f"or no release before the end)."
            )
        else:
            lines.append(f"It holds the stream ({by['by']}).")
        accel = held.get("x_accel_buffering_honoured")
        if accel is not None:
            lines.append(
                "It honours X-Accel-Buffering: no."
                if accel
                else "It ignores X-Accel-Buffering: no (the hold stays)."
            )
    frame = measures.get("framing")
    if frame is not None:
        rechunked = "re-chunked" if frame["rechunked"] else "passed as written"
        lines.append(
            f"Upstream leg: {frame['upstream_version']}, {frame['upstream_framing']}; "
            f"client leg: {frame['client_version']} {frame['client_framing']} ({rechunked})."
        )
    for side in ("request_headers", "response_headers"):
        changes = measures.get(side)
        if changes is None:
            continue
        said = [f"+{n}: {v}" for n, v in changes["added"]]
        said += [f"-{n}" for n, _ in changes["removed"]]
        said += [f"~{n}: {a} -> {b}" for n, a, b in changes["changed"]]
        name = side.replace("_", " ").capitalize()
        lines.append(f"{name}: {'; '.join(said) if said else 'unchanged'}.")
        if changes.get("varying"):
            per = "; ".join(f"{n}: {a} then {b or '(absent)'}" for n, a, b in changes["varying"])
            lines.append(f"{name} that changed on a second request: {per}.")
    for key, who in (("leave", "leaves"), ("leave_rst", "resets its connection")):
        gone = measures.get(key)
        if gone is None:
            continue
        if gone["learned"]:
            lines.append(
                f"A client that {who} is noticed by the upstream {gone['after']:.2f} s later "
                f"({gone['how']}), {gone['frames_after_close']} frames written after."
            )
        else:
            lines.append(
                f"A client that {who} is not noticed by the upstream within "
                f"{gone['at_least']:.1f} s: it generates for nobody."
            )
    squeezed = measures.get("compression")
    if squeezed is not None:
        lines.append(_compression_line(squeezed))
    fields = measures.get("sse_fields")
    if fields is not None:
        lines.append(_sse_line(fields))
    head = measures.get("head_idle")
    if head is not None:
        if head["cut"]:
            near = f" ± {head['uncertainty']:.2f} s" if head.get("uncertainty") is not None else ""
            lines.append(
                f"It ends a request whose head has not come after {head['timeout']:.2f} s"
                f"{near} (its timeout before the head): the client gets {head['end']}."
            )
        else:
            lines.append(
                f"Its timeout before the head is at least {head['at_least']:.1f} s (a head "
                f"that late passed)."
            )
    cap = measures.get("duration_cap")
    if cap is not None:
        if cap["cut"]:
            lines.append(
                f"It cuts a busy stream {cap['limit']:.2f} s (± {cap['uncertainty']:.2f} s) "
                f"after the request, whatever flows (a duration cap; the client saw a "
                f"{cap['client_saw']} response)."
            )
        else:
            lines.append(
                f"It caps a response's duration at no less than {cap['at_least']:.1f} s (a "
                f"steady stream that long passed)."
            )
    silent = measures.get("idle")
    if silent is not None:
        if silent["cut"]:
            lines.append(
                f"It cuts a stream silent for {silent['timeout']:.2f} s (its read timeout "
                f"after the head; the upstream saw a {silent['how']}, the client a "
                f"{silent['client_saw']} response)."
            )
        else:
            lines.append(
                f"Its read timeout after the head is at least {silent['at_least']:.1f} s "
                f"(a silence that long passed)."
            )
    lines += [f"Not measured: {item}." for item in document.get("not_measured", [])]
    return lines
