"""The connection journal: what crossed each leg of each connection, and when.

Per connection it records every chunk read or written on both legs (time, leg,
direction, size, stream offset), how each side ended (FIN, RST, write failure) and
every fault decision. It sits on the relay's hot path, so recording is an append of a
tuple to a list, bounded per connection (drops are counted, never blocking); byte
capture for the scorer is optional and bounded too. Protocol boundaries (HTTP heads,
SSE events) are derived later, off the hot path, by running the passive framers over
the captured bytes. Secrets in captured request heads (Authorization, api-key
headers) are redacted when the journal is written, unless the user asks otherwise.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from middlebox.fault import FaultReport
from middlebox.stream import Direction

MAX_RECORDS = 200_000
MAX_CAPTURE_BYTES = 8 * 1024 * 1024

_SECRET_HEADER = re.compile(
    rb"(?im)^(authorization|proxy-authorization|api-key|x-api-key|cookie)[ \t]*:[^\r\n]*"
)


def redact(data: bytes) -> bytes:
    """Blank the values of credential headers, keeping the header names visible."""
    return _SECRET_HEADER.sub(lambda m: m.group(1) + b": [redacted]", data)


@dataclass(eq=False)
class ConnectionJournal:
    """One connection's record; implements the relay's `RelayObserver`."""

    connection_id: int
    started_at: float
    capture: bool = False
    max_records: int = MAX_RECORDS
    max_capture_bytes: int = MAX_CAPTURE_BYTES
    records: list[tuple[Any, ...]] = field(default_factory=list)
    faults: list[FaultReport] = field(default_factory=list)
    dropped: int = 0
    offsets: dict[tuple[str, str, str], int] = field(default_factory=dict)
    captured: dict[tuple[str, str], bytearray] = field(default_factory=dict)

    def _chunk(self, op: str, leg: str, direction: Direction, data: bytes, now: float) -> None:
        key = (op, leg, direction.value)
        offset = self.offsets.get(key, 0)
        self.offsets[key] = offset + len(data)
        if len(self.records) >= self.max_records:
            self.dropped += 1
            return
        self.records.append((now, op, leg, direction.value, len(data), offset))
        if self.capture and op == "read":
            buffer = self.captured.setdefault((leg, direction.value), bytearray())
            if len(buffer) + len(data) <= self.max_capture_bytes:
                buffer += data
            else:
                self.dropped += 1

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self._chunk("read", leg, direction, data, now)

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self._chunk("wrote", leg, direction, data, now)

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        if len(self.records) < self.max_records:
            self.records.append((now, "end", leg, direction.value, kind, None))
        else:
            self.dropped += 1

    def fault(self, report: FaultReport) -> None:
        self.faults.append(report)

    # ---------------------------------------------------------------- reading

    def bytes_from(self, leg: str, direction: Direction) -> bytes:
        return bytes(self.captured.get((leg, direction.value), b""))

    def ends(self) -> list[tuple[float, str, str, str]]:
        return [(r[0], r[2], r[3], r[4]) for r in self.records if r[1] == "end"]

    def to_lines(self, *, redact_secrets: bool = True) -> list[dict[str, Any]]:
        """NDJSON-ready records: an open line, chunks, ends, faults and a summary."""
        lines: list[dict[str, Any]] = [
            {"type": "open", "connection": self.connection_id, "time": self.started_at}
        ]
        for time, op, leg, direction, size, offset in self.records:
            if op == "end":
                lines.append(
                    {"type": "end", "time": time, "leg": leg, "direction": direction, "kind": size}
                )
            else:
                lines.append(
                    {
                        "type": op,
                        "time": time,
                        "leg": leg,
                        "direction": direction,
                        "size": size,
                        "offset": offset,
                    }
                )
        for report in self.faults:
            lines.append(
                {
                    "type": "fault",
                    "time": report.time,
                    "fault": report.fault,
                    "action": report.action,
                    **_jsonable(report.details),
                }
            )
        for (leg, direction), data in self.captured.items():
            payload = redact(bytes(data)) if redact_secrets else bytes(data)
            lines.append(
                {
                    "type": "bytes",
                    "leg": leg,
                    "direction": direction,
                    "base64": base64.b64encode(payload).decode("ascii"),
                }
            )
        lines.append(
            {
                "type": "summary",
                "connection": self.connection_id,
                "records": len(self.records),
                "dropped": self.dropped,
            }
        )
        return lines


def _jsonable(details: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value if isinstance(value, str | int | float | bool | None) else repr(value)
        for key, value in details.items()
    }


@dataclass
class JournalStore:
    """All journals of one proxy run; hands the server its observer and fault-report sink."""

    capture: bool = False
    clock_offset: float = 0.0
    journals: dict[int, ConnectionJournal] = field(default_factory=dict)

    def observer(self, connection_id: int, started_at: float) -> ConnectionJournal:
        journal = ConnectionJournal(connection_id, started_at, capture=self.capture)
        self.journals[connection_id] = journal
        return journal

    def fault_sink(self, connection_id: int) -> Any:
        def sink(report: FaultReport) -> None:
            journal = self.journals.get(connection_id)
            if journal is not None:
                journal.fault(report)

        return sink

    def fault_reports(self) -> list[FaultReport]:
        return [report for journal in self.journals.values() for report in journal.faults]

    @property
    def dropped(self) -> int:
        return sum(journal.dropped for journal in self.journals.values())

    def write_ndjson(self, path: Path, *, redact_secrets: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for connection_id in sorted(self.journals):
                for line in self.journals[connection_id].to_lines(redact_secrets=redact_secrets):
                    out.write(json.dumps(line, separators=(",", ":")) + "\n")
