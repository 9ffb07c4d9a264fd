"""The connection journal: what crossed each leg of each connection, and when.

Per connection it records every chunk read or written on both legs (time, leg,
direction, size, stream offset), how each side ended (FIN, RST, write failure,
timeout) and every fault decision. It sits on the relay's hot path, so recording is
an append of a tuple to a list, bounded per connection (drops are counted, never
blocking); byte capture is optional and bounded too. Protocol boundaries (HTTP
heads, SSE events) come from framing the captured bytes of each leg once
(`middlebox.core.framed`), off the hot path, when they are first asked for (`leg`); the
scorer and `record` read that same `LegRecord`. Not the pipeline's own framing: that is
what the faults emitted toward a leg, and a fault holding bytes when it resets the
connection (`handoff`), or a reset that discards what was still unsent, means some of it
never crossed. Secrets in
captured heads (Authorization, api-key, cookies) are redacted
when the journal is written, unless the user asks otherwise.

Times: the relay stamps records with its own clock (trio's monotonic one); the
journal keeps the offset to the wall clock taken when the connection opened, so the
NDJSON carries wall-clock seconds that line up with the emulator's ledger and the
clients' result files.

NDJSON line types (each carries `connection`): `open`, `read`/`wrote` (a chunk on
a leg), `end`, `fault`, `http_head`, `http_end`, `sse_event`, `bytes` (the captured
bytes of one leg and direction, base64) and `summary` (totals, end kinds, drops).
"""

from __future__ import annotations

import base64
import bisect
import json
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from middlebox.core.dialects import EndKind, dialect_for, read
from middlebox.core.fault import REPORTS_KEPT, FaultReport
from middlebox.core.framed import LegRecord
from middlebox.core.stream import Direction

MAX_RECORDS = 200_000
MAX_CAPTURE_BYTES = 8 * 1024 * 1024
MAX_BOUNDARIES = 20_000
LEGS = ("client", "upstream")

# A name "says" a secret when one of its words (split on - _ . and spaces) ends in one of
# these, or begins with "auth": Authorization, X-Api-Key, api_key, access_token,
# client_secret, Set-Cookie, X-Auth-Token ... but not max_tokens or
# x-ratelimit-remaining-tokens (plural counts, not credentials).
SECRET_WORD_ENDINGS = ("key", "token", "secret", "password", "passwd", "cookie", "credential")
# Named outright: they identify the account without saying so (OpenAI's headers).
SECRET_NAMES = frozenset({"openai-organization", "openai-project"})
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Redaction:
    """Which header, query parameter and JSON field names carry secrets; `extra_names`
    adds names of your own (matched case-insensitively, whole name)."""

    word_endings: tuple[str, ...] = SECRET_WORD_ENDINGS
    names: frozenset[str] = SECRET_NAMES
    extra_names: frozenset[str] = frozenset()

    def with_names(self, *names: str) -> Redaction:
        return Redaction(
            self.word_endings,
            self.names,
            self.extra_names | {name.lower() for name in names if name},
        )

    def is_secret(self, name: str | bytes) -> bool:
        text = (name.decode("latin-1") if isinstance(name, bytes) else name).strip().lower()
        if not text:
            return False
        if text in self.names or text in self.extra_names:
            return True
        return any(
            word.startswith("auth") or word.endswith(self.word_endings)
            for word in re.split(r"[-_.\s]+", text)
            if word
        )

    def target(self, target: str) -> str:
        """A request target with the values of its secret query parameters blanked."""
        if "?" not in target:
            return target
        path, _, query = target.partition("?")
        return path + "?" + self._query(query.encode("latin-1")).decode("latin-1")

    def _query(self, text: bytes) -> bytes:
        return _QUERY_PARAMETER.sub(
            lambda m: (
                m.group(1) + m.group(2) + b"=" + REDACTED.encode()
                if self.is_secret(_unquote(m.group(2)))
                else m.group(0)
            ),
            text,
        )

    def data(self, data: bytes, *, request: bool = True) -> bytes:
        """Captured bytes with secrets blanked: credential header values (any header
        line), query parameter values (request targets and form bodies) and, in
        requests, JSON string fields whose name says a secret. Responses keep their JSON
        fields: a logprobs `"token": "Hello"` is generated text, not a credential."""
        data = _HEADER_LINE.sub(
            lambda m: (
                m.group(1) + b": " + REDACTED.encode() if self.is_secret(m.group(1)) else m.group(0)
            ),
            data,
        )
        data = self._query(data)
        if request:
            data = _JSON_STRING_FIELD.sub(
                lambda m: (
                    m.group(1) + b'"' + REDACTED.encode() + b'"'
                    if self.is_secret(m.group(2))
                    else m.group(0)
                ),
                data,
            )
        return data

    def headers(self, headers: Iterable[tuple[str, str]]) -> list[list[str]]:
        return [[name, REDACTED if self.is_secret(name) else value] for name, value in headers]


DEFAULT_REDACTION = Redaction()
# A header line: a token name at a line start, a colon, the value to the line end.
_HEADER_LINE = re.compile(rb"(?m)^([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[^\r\n]*")
# name=value after ? or & (or a line start, for a form body): the value up to the next
# separator; the name's percent-escapes are decoded before it is judged.
_QUERY_PARAMETER = re.compile(rb"(?m)([?&]|^)([^=&?\s\"#/]+)=([^&\s\"#]*)")
# "name": "string value" anywhere in a JSON text (escapes inside the value kept whole).
_JSON_STRING_FIELD = re.compile(rb'("((?:[^"\\]|\\.){1,200})"\s*:\s*)"(?:[^"\\]|\\.)*"')


def _unquote(name: bytes) -> str:
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(name.replace(b"+", b" ")).decode("latin-1")


def redact(data: bytes, redaction: Redaction = DEFAULT_REDACTION, *, request: bool = True) -> bytes:
    """Blank secret values (see `Redaction.data`), keeping the names visible."""
    return redaction.data(data, request=request)


@dataclass(eq=False)
class ConnectionJournal:
    """One connection's record; implements the relay's `RelayObserver`."""

    connection_id: int
    started_at: float
    capture: bool = False
    max_records: int = MAX_RECORDS
    max_capture_bytes: int = MAX_CAPTURE_BYTES
    clock_offset: float = 0.0
    scenario: str = ""
    redaction: Redaction = DEFAULT_REDACTION
    records: list[tuple[Any, ...]] = field(default_factory=list)
    faults: list[FaultReport] = field(default_factory=list)
    # (fault, action) -> [reports seen, time of the last]: past the first REPORTS_KEPT of a
    # pair, reports are counted here, not kept (a `coalescer` flushes millions of times on a
    # long stream); written as one `fault_more` line per pair when the connection ends.
    fault_counts: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    dropped: int = 0
    capture_dropped: int = 0
    offsets: dict[tuple[str, str, str], int] = field(default_factory=dict)
    captured: dict[tuple[str, str], bytearray] = field(default_factory=dict)
    end_kinds: list[tuple[str, str, str]] = field(default_factory=list)
    _time_index: dict[tuple[str, str, int], tuple[list[int], list[float]]] = field(
        default_factory=dict, repr=False
    )
    _framed: dict[tuple[str, bool, bool], LegRecord] = field(default_factory=dict, repr=False)
    # How much `new_lines` has handed out already (the on-disk writer's progress).
    _written_records: int = field(default=0, repr=False)
    _written_faults: int = field(default=0, repr=False)
    _opened_written: bool = field(default=False, repr=False)

    def leg(self, leg: str, *, keep_pieces: bool = False, ended: bool = False) -> LegRecord:
        """What was framed on `leg`: its captured bytes framed once (and kept: asking
        again frames nothing)."""
        key = (leg, keep_pieces, ended)
        record = self._framed.get(key)
        if record is None:
            record = LegRecord.from_bytes(
                self.bytes_from(leg, Direction.UPSTREAM),
                self.bytes_from(leg, Direction.DOWNSTREAM),
                keep_pieces=keep_pieces,
                ended=ended,
                limit=None if keep_pieces else MAX_BOUNDARIES,
            )
            self._framed[key] = record
        return record

    def _chunk(self, op: str, leg: str, direction: Direction, data: bytes, now: float) -> None:
        key = (op, leg, direction.value)
        offset = self.offsets.get(key, 0)
        self.offsets[key] = offset + len(data)
        if len(self.records) >= self.max_records:
            self.dropped += 1
        else:
            self.records.append((now, op, leg, direction.value, len(data), offset))
        if self.capture:
            # Each (leg, direction) is read on one side and written on the other, so one
            # buffer per pair holds exactly the bytes that crossed that leg that way.
            buffer = self.captured.setdefault((leg, direction.value), bytearray())
            if len(buffer) == offset and offset + len(data) <= self.max_capture_bytes:
                buffer += data
            else:
                self.capture_dropped += len(data)

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self._chunk("read", leg, direction, data, now)

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self._chunk("wrote", leg, direction, data, now)

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        """`kind`: read_fin, read_rst, sent_fin, sent_rst, write_failed, timeout, ..."""
        self.end_kinds.append((leg, direction.value, kind))
        if len(self.records) < self.max_records:
            self.records.append((now, "end", leg, direction.value, kind, None))
        else:
            self.dropped += 1

    def fault(self, report: FaultReport) -> None:
        key = (report.fault, report.action)
        counted = self.fault_counts.get(key)
        if counted is None:
            counted = self.fault_counts[key] = [0, report.time]
        counted[0] += 1
        counted[1] = report.time
        if counted[0] > REPORTS_KEPT:
            return  # counted: a `fault_more` line says how many
        if len(self.faults) < self.max_records:
            self.faults.append(report)
        else:
            self.dropped += 1

    # ---------------------------------------------------------------- reading

    def bytes_from(self, leg: str, direction: Direction) -> bytes:
        return bytes(self.captured.get((leg, direction.value), b""))

    def total_bytes(self, leg: str, direction: Direction) -> int:
        """Bytes that crossed `leg` toward `direction`'s receiver (dropped records included)."""
        op = "read" if (leg == "client") == (direction is Direction.UPSTREAM) else "wrote"
        return self.offsets.get((op, leg, direction.value), 0)

    def summary(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "connection": self.connection_id,
            "scenario": self.scenario,
            "records": len(self.records),
            "dropped": self.dropped,
            "capture_dropped_bytes": self.capture_dropped,
            "bytes": {
                f"{leg}.{direction.value}": self.total_bytes(leg, direction)
                for leg in LEGS
                for direction in Direction
            },
            "ends": [
                {"leg": leg, "direction": direction, "kind": kind}
                for leg, direction, kind in self.end_kinds
            ],
            "faults_fired": sorted({report.fault for report in self.faults}),
            "faults_more": {
                f"{fault}:{action}": more for fault, action, more, _ in self._faults_more()
            },
        }

    def _faults_more(self) -> list[tuple[str, str, int, float]]:
        """(fault, action, reports counted past the kept ones, time of the last)."""
        return [
            (fault, action, int(count) - REPORTS_KEPT, last)
            for (fault, action), (count, last) in self.fault_counts.items()
            if count > REPORTS_KEPT
        ]

    def _fault_more_lines(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "fault_more",
                "time": last + self.clock_offset,
                "fault": fault,
                "action": action,
                "count": more,
                "kept": REPORTS_KEPT,
            }
            for fault, action, more, last in self._faults_more()
        ]

    def _record_line(self, record: tuple[Any, ...]) -> dict[str, Any]:
        at, op, leg, direction, size, offset = record
        at += self.clock_offset
        if op == "end":
            return {"type": "end", "time": at, "leg": leg, "direction": direction, "kind": size}
        return {
            "type": op,
            "time": at,
            "leg": leg,
            "direction": direction,
            "size": size,
            "offset": offset,
        }

    def _fault_line(self, report: FaultReport) -> dict[str, Any]:
        return {
            "type": "fault",
            "time": report.time + self.clock_offset,
            "fault": report.fault,
            "action": report.action,
            **_jsonable(report.details),
        }

    def _open_line(self) -> dict[str, Any]:
        return {
            "type": "open",
            "connection": self.connection_id,
            "time": self.started_at,
            "scenario": self.scenario,
        }

    def _closing_lines(self, redact_secrets: bool) -> list[dict[str, Any]]:
        """The captured bytes of each leg and direction, then the summary."""
        cid = self.connection_id
        lines: list[dict[str, Any]] = []
        for (leg, direction), data in self.captured.items():
            payload = bytes(data)
            if redact_secrets:
                payload = self.redaction.data(
                    payload, request=direction == Direction.UPSTREAM.value
                )
            lines.append(
                {
                    "type": "bytes",
                    "connection": cid,
                    "leg": leg,
                    "direction": direction,
                    "base64": base64.b64encode(payload).decode("ascii"),
                }
            )
        lines.append(self.summary())
        return lines

    def to_lines(self, *, redact_secrets: bool = True) -> list[dict[str, Any]]:
        """NDJSON-ready records in time order: open, chunks, ends, faults and protocol
        boundaries, then the captured bytes and a summary."""
        cid = self.connection_id
        timed: list[tuple[float, int, dict[str, Any]]] = []
        for seq, record in enumerate(self.records):
            line = self._record_line(record)
            timed.append((line["time"], seq, line))
        base = len(self.records)
        for seq, report in enumerate(self.faults, start=base):
            line = self._fault_line(report)
            timed.append((line["time"], seq, line))
        base += len(self.faults)
        for seq, line in enumerate(self._fault_more_lines(), start=base):
            timed.append((line["time"], seq, line))
        base += len(self.fault_counts)
        for seq, boundary in enumerate(self.boundaries(redact_secrets=redact_secrets), start=base):
            timed.append((boundary["time"], seq, boundary))
        timed.sort(key=lambda entry: (entry[0], entry[1]))
        lines: list[dict[str, Any]] = [self._open_line()]
        lines += [{**line, "connection": cid} for _, _, line in timed]
        return lines + self._closing_lines(redact_secrets)

    def new_lines(self, *, final: bool, redact_secrets: bool = True) -> list[dict[str, Any]]:
        """The lines not handed out yet, for a journal written as it goes: the open line
        once, then the chunks, ends and faults recorded since the last call; with
        `final` (the connection ended) also its boundaries, captured bytes and summary.
        Read back with `read_ndjson`, the pieces make the same journal as `to_lines`."""
        cid = self.connection_id
        lines: list[dict[str, Any]] = []
        if not self._opened_written:
            lines.append(self._open_line())
            self._opened_written = True
        fresh = [self._record_line(r) for r in self.records[self._written_records :]]
        fresh += [self._fault_line(r) for r in self.faults[self._written_faults :]]
        self._written_records = len(self.records)
        self._written_faults = len(self.faults)
        if final:
            fresh += self._fault_more_lines()
            fresh += self.boundaries(redact_secrets=redact_secrets)
        fresh.sort(key=lambda line: float(line["time"]))
        lines += [{**line, "connection": cid} for line in fresh]
        if final:
            lines += self._closing_lines(redact_secrets)
        return lines

    # ------------------------------------------------------ protocol boundaries

    def time_at(self, leg: str, direction: str, offset: int) -> float:
        """When the chunk holding byte `offset` crossed `leg` (wall clock)."""
        key = (leg, direction, len(self.records))
        index = self._time_index.get(key)
        if index is None:
            op = "read" if (leg == "client") == (direction == Direction.UPSTREAM.value) else "wrote"
            rows = [r for r in self.records if r[1] == op and r[2] == leg and r[3] == direction]
            index = ([r[5] for r in rows], [r[0] for r in rows])
            # One index per leg and direction, for the records as they are now: an open
            # connection read again (GET /journals) has more records, and a new index.
            for stale in [k for k in self._time_index if k[:2] == key[:2]]:
                del self._time_index[stale]
            self._time_index[key] = index
        starts, times = index
        if not starts:
            return self.started_at
        position = max(bisect.bisect_right(starts, offset) - 1, 0)
        return float(times[position]) + self.clock_offset

    def boundaries(self, *, redact_secrets: bool = True) -> list[dict[str, Any]]:
        """HTTP heads, message ends and SSE events on each leg (see `leg`)."""
        out: list[dict[str, Any]] = []
        for leg in LEGS:
            if not any(self.captured.get((leg, d.value)) for d in Direction):
                continue
            record = self.leg(leg)
            for direction in Direction:
                out += self._leg_boundaries(leg, direction, record, redact_secrets)
            self.dropped += record.dropped
            record.dropped = 0
        return out

    def _leg_boundaries(
        self, leg: str, direction: Direction, record: LegRecord, redact_secrets: bool
    ) -> list[dict[str, Any]]:
        """One direction's boundaries in stream order (an end before the next head)."""
        found: list[tuple[int, int, dict[str, Any]]] = []
        where = {"leg": leg, "direction": direction.value}
        for message, offset, size, head in record.heads[direction]:
            headers = (
                self.redaction.headers(head.headers)
                if redact_secrets
                else [[name, value] for name, value in head.headers]
            )
            target = self.redaction.target(head.target or "") if redact_secrets else head.target
            start = (
                f"{head.method} {target} {head.version}"
                if head.is_request
                else f"{head.version} {head.status} {head.reason or ''}".rstrip()
            )
            found.append(
                (
                    offset,
                    1,
                    {
                        "type": "http_head",
                        "time": self.time_at(leg, direction.value, offset),
                        **where,
                        "message": message,
                        "offset": offset,
                        "size": size,
                        "start_line": start,
                        "headers": headers,
                    },
                )
            )
        dialects = {
            message: dialect_for(head.method or "", head.target or "")
            for message, _, _, head in record.heads[Direction.UPSTREAM]
        }
        for message, offset, event in record.events[direction]:
            meaning = read(event, dialects.get(message))
            found.append(
                (
                    offset,
                    2,
                    {
                        "type": "sse_event",
                        "time": self.time_at(leg, direction.value, offset),
                        **where,
                        "message": message,
                        "offset": offset,
                        "size": len(event.raw),
                        "index": event.index,
                        "event": event.event,
                        "id": event.id,
                        # the one rule of middlebox.core.dialects: the stream's closing
                        # event in its API ([DONE], message_stop, response.completed...)
                        "done": meaning.last,
                        "error": meaning.end is EndKind.ERROR,
                    },
                )
            )
        for message, end in record.ends[direction]:
            found.append(
                (
                    end,
                    0,
                    {
                        "type": "http_end",
                        "time": self.time_at(leg, direction.value, max(end - 1, 0)),
                        **where,
                        "message": message,
                        "offset": end,
                    },
                )
            )
        found.sort(key=lambda entry: (entry[0], entry[1]))
        return [line for _, _, line in found]


def _jsonable(details: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value if isinstance(value, str | int | float | bool | None) else repr(value)
        for key, value in details.items()
    }


@dataclass(frozen=True)
class JournalSink:
    """A connection's fault-report sink: its reports go to its journal, once that is open."""

    store: JournalKeeper
    connection_id: int

    def __call__(self, report: FaultReport) -> None:
        journal = self.store.journals.get(self.connection_id)
        if journal is not None:
            journal.fault(report)


class JournalKeeper:
    """What both stores of journals (`JournalStore` in memory, `JournalWriter` on disk) do
    for the server: open a connection's journal with their capture, redaction and clock
    settings, and sink its fault reports."""

    capture: bool
    clock_offset: float | None
    max_capture_bytes: int
    redaction: Redaction
    journals: dict[int, ConnectionJournal]

    def observer(
        self,
        connection_id: int,
        started_at: float,
        scenario: str = "",
        clock_offset: float | None = None,
    ) -> ConnectionJournal:
        """`clock_offset`: wall clock minus the relay's clock, from the shell
        (shell.server.relay_clock_offset), since observe depends on no event loop."""
        offset = next((o for o in (clock_offset, self.clock_offset) if o is not None), 0.0)
        journal = ConnectionJournal(
            connection_id,
            started_at,
            capture=self.capture,
            max_capture_bytes=self.max_capture_bytes,
            clock_offset=offset,
            scenario=scenario,
            redaction=self.redaction,
        )
        self.journals[connection_id] = journal
        self.opened(connection_id)
        return journal

    def opened(self, connection_id: int) -> None:
        """Called once a connection's journal is open: a bounded store evicts here."""

    def fault_sink(self, connection_id: int) -> JournalSink:
        return JournalSink(self, connection_id)


@dataclass
class JournalStore(JournalKeeper):
    """All journals of one proxy run; hands the server its observer and fault-report sink.

    `max_connections` bounds a long-running proxy (the control API keeps the latest
    ones); older journals are evicted and counted in `evicted`.
    """

    capture: bool = False
    clock_offset: float | None = None
    max_connections: int | None = None
    max_capture_bytes: int = MAX_CAPTURE_BYTES
    redaction: Redaction = DEFAULT_REDACTION
    journals: dict[int, ConnectionJournal] = field(default_factory=dict)
    evicted: int = 0
    evicted_dropped: int = 0
    _order: deque[int] = field(default_factory=deque, repr=False)

    def opened(self, connection_id: int) -> None:
        self._order.append(connection_id)
        if self.max_connections is not None:
            while len(self._order) > self.max_connections:
                old = self.journals.pop(self._order.popleft(), None)
                if old is not None:
                    self.evicted += 1
                    self.evicted_dropped += old.dropped

    def fault_reports(self) -> list[FaultReport]:
        return [report for journal in self.journals.values() for report in journal.faults]

    @property
    def dropped(self) -> int:
        return self.evicted_dropped + sum(journal.dropped for journal in self.journals.values())

    def clear(self) -> None:
        self.journals.clear()
        self._order.clear()
        self.evicted = self.evicted_dropped = 0

    def write_ndjson(self, path: Path, *, redact_secrets: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for connection_id in sorted(self.journals):
                for line in self.journals[connection_id].to_lines(redact_secrets=redact_secrets):
                    out.write(json.dumps(line, separators=(",", ":")) + "\n")


# Default total size of an on-disk journal (`proxy --journal-max-bytes`).
MAX_JOURNAL_BYTES = 1024 * 1024 * 1024
FLUSH_INTERVAL = 1.0


@dataclass
class JournalWriter(JournalKeeper):
    """`proxy --journal FILE`: every connection's lines appended to FILE as it goes.

    The relay records into a `ConnectionJournal` as before; what it recorded is written
    (and the file flushed) when the connection ends (`connection_ended`, then the
    journal is forgotten, so memory holds only the open connections) and by `tick`,
    which the server calls at least every second, for the open ones' chunks, ends and
    faults so far. A SIGKILL therefore loses at most the open connections' last second,
    their boundaries and captured bytes (written when they end). The file is bounded by
    `max_bytes`: past it, lines are dropped and counted, never blocking the relay, and a
    last `journal` line (no `connection`) says how many, when the proxy stops.
    `path_for(connection_id)` names the file (one per `--workers` worker); it is opened
    on the first write, so a forked worker opens its own."""

    path_for: Callable[[int], Path]
    capture: bool = True
    redact_secrets: bool = True
    redaction: Redaction = DEFAULT_REDACTION
    max_bytes: int = MAX_JOURNAL_BYTES
    max_capture_bytes: int = MAX_CAPTURE_BYTES
    clock_offset: float | None = None
    journals: dict[int, ConnectionJournal] = field(default_factory=dict)
    written_bytes: int = 0
    connections_written: int = 0
    dropped_lines: int = 0
    dropped_connections: int = 0
    _file: IO[str] | None = field(default=None, repr=False)
    _dirty: bool = field(default=False, repr=False)
    _dropped_ids: set[int] = field(default_factory=set, repr=False)

    def connection_ended(self, connection_id: int) -> None:
        """Write the rest of a finished connection, flush, and forget it."""
        journal = self.journals.pop(connection_id, None)
        if journal is None:
            return
        self._write(journal, journal.new_lines(final=True, redact_secrets=self.redact_secrets))
        self._dropped_ids.discard(connection_id)
        self.connections_written += 1
        self.flush()

    def tick(self) -> None:
        """The open connections' new records, then a flush (the server's 1 s timer)."""
        for journal in list(self.journals.values()):
            lines = journal.new_lines(final=False, redact_secrets=self.redact_secrets)
            if lines:
                self._write(journal, lines)
        self.flush()

    def _write(self, journal: ConnectionJournal, lines: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        size = len(text.encode("utf-8"))
        if self.written_bytes + size > self.max_bytes:
            self.dropped_lines += len(lines)
            if journal.connection_id not in self._dropped_ids:
                self._dropped_ids.add(journal.connection_id)
                self.dropped_connections += 1
            return
        if self._file is None:
            path = self.path_for(journal.connection_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")
        self._file.write(text)
        self.written_bytes += size
        self._dirty = True

    def flush(self) -> None:
        if self._file is not None and self._dirty:
            self._file.flush()
            self._dirty = False

    def close(self) -> None:
        """At shutdown: finish the connections still open, write the totals, close."""
        for connection_id in list(self.journals):
            self.connection_ended(connection_id)
        if self._file is not None:
            totals = {
                "type": "journal",
                "connections": self.connections_written,
                "bytes": self.written_bytes,
                "dropped_lines": self.dropped_lines,
                "dropped_connections": self.dropped_connections,
                "max_bytes": self.max_bytes,
            }
            self._file.write(json.dumps(totals, separators=(",", ":")) + "\n")
            self._file.close()
            self._file = None


# --------------------------------------------------------------------- reading


@dataclass
class JournalView:
    """One connection read back from NDJSON: its lines grouped by type."""

    connection: int
    opened_at: float = 0.0
    chunks: list[dict[str, Any]] = field(default_factory=list)
    ends: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    faults_more: list[dict[str, Any]] = field(default_factory=list)
    """`fault_more` lines: per fault and action, the reports counted past the kept ones."""
    boundaries: list[dict[str, Any]] = field(default_factory=list)
    captured: dict[tuple[str, str], bytes] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    def add(self, line: dict[str, Any]) -> None:
        """File one journal line under its type. `open` and `bytes` lines are left to the
        caller: a file gives them, a journal in memory has its start and captured bytes."""
        kind = line.get("type")
        if kind in ("read", "wrote"):
            self.chunks.append(line)
        elif kind == "end":
            self.ends.append(line)
        elif kind == "fault":
            self.faults.append(line)
        elif kind == "fault_more":
            self.faults_more.append(line)
        elif kind in ("http_head", "http_end", "sse_event"):
            self.boundaries.append(line)
        elif kind == "summary":
            self.summary = line


class JournalError(ValueError):
    """A file that is no journal, named with the line where it stops being one."""


A_JOURNAL = "a journal (NDJSON: one JSON object a line, as `--journal` writes it) was expected"


def read_ndjson(path: str | Path) -> list[JournalView]:
    """Every connection of a journal file, in connection order. A journal written as it
    went (`JournalWriter`) has each connection's lines in pieces, read as one view. A file
    that is no journal (a report.json, a capture) is a JournalError naming its line."""
    views: dict[int, JournalView] = {}
    try:
        with Path(path).open(encoding="utf-8") as lines:
            for number, text in enumerate(lines, start=1):
                if not text.strip():
                    continue
                try:
                    line = json.loads(text)
                except json.JSONDecodeError as error:
                    if number > 1 and not text.endswith("\n"):
                        break  # a last line cut by a SIGKILL mid-write: everything before holds
                    raise JournalError(
                        f"{path}:{number}: not a JSON line ({error.msg}); {A_JOURNAL}"
                    ) from None
                if not isinstance(line, dict) or (
                    "connection" not in line and line.get("type") != "journal"
                ):
                    raise JournalError(
                        f"{path}:{number}: not a journal line (no `connection`); {A_JOURNAL}"
                    )
                if "connection" in line:  # else the writer's closing `journal` totals
                    read_line(views, line)
    except UnicodeDecodeError as error:
        raise JournalError(f"{path}: not UTF-8 text (byte {error.start}); {A_JOURNAL}") from None
    return [views[cid] for cid in sorted(views)]


def read_line(views: dict[int, JournalView], line: dict[str, Any]) -> None:
    cid = int(line["connection"])
    view = views.setdefault(cid, JournalView(cid))
    kind = line.get("type")
    if kind == "open":
        view.opened_at = float(line.get("time") or 0.0)
    elif kind == "bytes":
        view.captured[(line["leg"], line["direction"])] = base64.b64decode(line["base64"])
    else:
        view.add(line)


def facts(views: Iterable[JournalView]) -> dict[str, Any]:
    """Journal-derived facts for tests and the plugin: connections, faults fired, ends."""
    views = list(views)
    fired: dict[str, int] = {}
    for view in views:
        for name in {fault["fault"] for fault in view.faults}:
            fired[name] = fired.get(name, 0) + 1
    return {
        "connections": len(views),
        "faults_fired": fired,
        "fault_actions": sorted({f"{f['fault']}:{f['action']}" for v in views for f in v.faults}),
        "end_kinds": [sorted({f"{e['leg']}.{e['kind']}" for e in v.ends}) for v in views],
        "sse_events_to_client": sum(
            1
            for v in views
            for b in v.boundaries
            if b["type"] == "sse_event" and b["leg"] == "client"
        ),
        "dropped": sum(int(v.summary.get("dropped") or 0) for v in views),
    }


def fault_proof(declared: list[str], journals: dict[str, JournalStore]) -> dict[str, Any]:
    """Per scenario: connections per client, and per declared fault the connections it
    fired on and those it was bypassed on (present in the path but never reported)."""
    connections = {client: len(store.journals) for client, store in journals.items()}
    faults: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(declared):
        fired_on = 0
        bypassed_on = 0
        clients_fired = []
        for client, store in journals.items():
            hits = sum(1 for j in store.journals.values() if any(r.fault == name for r in j.faults))
            fired_on += hits
            bypassed_on += len(store.journals) - hits
            if hits:
                clients_fired.append(client)
        faults[name] = {
            "fired": fired_on,
            "bypassed": bypassed_on,
            "clients_fired": clients_fired,
            "clients_bypassed": [c for c in journals if c not in clients_fired],
        }
    return {
        "connections": connections,
        "faults": faults,
        "journal_drops": sum(store.dropped for store in journals.values()),
    }
