"""The contract of an HTTP/2 connection-level fault (pure).

A `Fault` sees one byte stream; on HTTP/2 each stream is relayed as one HTTP/1.1 byte stream
(core/h2_bridge.py), so every existing fault works per stream. What happens to the connection
that carries the streams (a GOAWAY, an RST_STREAM with a chosen code, a flow-control window that
stops opening, a SETTINGS limit, a dropped connection) is decided by an `H2Fault`: a small
per-connection state machine fed what the HTTP/2 session sees, with time as `now`, returning
`H2Action`s the shell's session (shell/h2_streams.py) executes. It holds no socket or clock.

Events it is fed, all toward the client's connection:
- `on_connection_open(now)`: the HTTP/2 connection is established (the client's preface);
- `on_stream_open(stream_id, now)`: a request stream opened (HEADERS from the client);
- `on_stream_data(stream_id, data, now)`: DATA about to go to the client on a stream (the
  response body, de-chunked), before the flow-control windows are consulted;
- `on_stream_close(stream_id, now)`: the stream ended (either way);
- `on_h2_deadline(now)` when `h2_deadline()` has passed.

And it is asked:
- `h2_settings()`: SETTINGS values it imposes (RFC 9113 §6.5.2), sent in the server preface;
- `send_credit(stream_id)`: how many bytes of DATA the stream may still send now, None for
  the windows alone: a flow-control window that the client stopped (or slowed) opening.

A class is both a `Fault` (a pass-through on each stream's bytes, so the scenario loader and
the registry find it in `path:`) and an `H2Fault`; the session keeps the instances of the
connection's pipeline that are `H2Fault`s.
"""

from __future__ import annotations

from dataclasses import dataclass

# RFC 9113 §7 error codes, the ones a fault may name.
H2_ERROR_CODES: dict[str, int] = {
    "NO_ERROR": 0x0,
    "PROTOCOL_ERROR": 0x1,
    "INTERNAL_ERROR": 0x2,
    "FLOW_CONTROL_ERROR": 0x3,
    "STREAM_CLOSED": 0x5,
    "REFUSED_STREAM": 0x7,
    "CANCEL": 0x8,
    "ENHANCE_YOUR_CALM": 0xB,
}
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3


@dataclass(frozen=True, slots=True)
class ResetStream:
    """RST_STREAM with `error_code` toward the client; the stream's relay is reset upstream."""

    stream_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class SendGoaway:
    """GOAWAY naming the last stream served (RFC 9113 §6.8): newer streams are refused with
    REFUSED_STREAM, the connection closes once the streams up to it have ended."""

    last_stream_id: int
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class DropConnection:
    """The TCP connection goes (`how: rst` an RST, `fin` a close without GOAWAY): every
    multiplexed stream dies at once, each relay is reset upstream."""

    how: str = "rst"


H2Action = ResetStream | SendGoaway | DropConnection


class H2Fault:
    """Mixin: the hooks an HTTP/2 connection-level fault overrides; all default to nothing."""

    def h2_settings(self) -> dict[int, int]:
        return {}

    def on_connection_open(self, now: float) -> list[H2Action]:
        return []

    def on_stream_open(self, stream_id: int, now: float) -> list[H2Action]:
        return []

    def on_stream_data(self, stream_id: int, data: bytes, now: float) -> list[H2Action]:
        return []

    def on_stream_close(self, stream_id: int, now: float) -> list[H2Action]:
        return []

    def h2_deadline(self) -> float | None:
        return None

    def on_h2_deadline(self, now: float) -> list[H2Action]:
        return []

    def send_credit(self, stream_id: int, now: float) -> int | None:
        return None


def earliest(deadlines: list[float | None]) -> float | None:
    """The first of several deadlines (None: none wanted)."""
    wanted = [d for d in deadlines if d is not None]
    return min(wanted) if wanted else None
