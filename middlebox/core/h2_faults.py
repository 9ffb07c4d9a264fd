"""The contract of an HTTP/2 connection-level fault (pure).

A `Fault` sees one byte stream; on HTTP/2 each stream is relayed as one HTTP/1.1 byte stream
(core/h2_bridge.py), so every existing fault works per stream. What happens to the connection
that carries the streams (a GOAWAY, an RST_STREAM with a chosen code, a flow-control window that
stops opening, a SETTINGS limit, a dropped connection) is decided by an `H2Fault`: a small
per-connection state machine fed what the HTTP/2 session sees, with time as `now`, returning
`H2Action`s: the `Effects.commands` (core/fault.py) of the one effect vocabulary. It holds no
socket or clock. `H2Faults` drives a connection's faults as one, as `Pipeline` drives a
stream's: each event in, the `Effects` out, which the shell's session (shell/h2_streams.py)
performs in its `apply`, as the relay performs a pipeline's.

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

from collections.abc import Callable, Sequence

from middlebox.core.fault import Command, DropConnection, Effects, ResetStream, SendGoaway

__all__ = [
    "H2_ERROR_CODES",
    "SETTINGS_MAX_CONCURRENT_STREAMS",
    "DropConnection",
    "H2Action",
    "H2Fault",
    "H2Faults",
    "ResetStream",
    "SendGoaway",
    "earliest",
]

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


# The actions an `H2Fault` returns are the shared `Effects` vocabulary's commands (core/fault.py),
# named here as the faults name them.
H2Action = Command


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


Hook = Callable[[H2Fault, float], list[H2Action]]


class H2Faults:
    """One HTTP/2 connection's `H2Fault`s driven as one: each event goes to every fault in
    order, and the call answers the `Effects` of it (the commands in `commands`, the
    earliest deadline in `wake`), so the shell hears HTTP/2's wishes as it hears a
    pipeline's."""

    def __init__(self, faults: Sequence[H2Fault] = ()) -> None:
        self.faults: tuple[H2Fault, ...] = tuple(faults)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def settings(self) -> dict[int, int]:
        """The SETTINGS values the faults impose, the later fault's value winning."""
        settings: dict[int, int] = {}
        for fault in self.faults:
            settings.update(fault.h2_settings())
        return settings

    def open(self, now: float) -> Effects:
        return self._each(lambda fault, at: fault.on_connection_open(at), now)

    def stream_open(self, stream_id: int, now: float) -> Effects:
        return self._each(lambda fault, at: fault.on_stream_open(stream_id, at), now)

    def stream_data(self, stream_id: int, data: bytes, now: float) -> Effects:
        return self._each(lambda fault, at: fault.on_stream_data(stream_id, data, at), now)

    def stream_close(self, stream_id: int, now: float) -> Effects:
        return self._each(lambda fault, at: fault.on_stream_close(stream_id, at), now)

    def wake(self, now: float) -> Effects:
        """`on_h2_deadline` for every fault (a fault whose deadline is not due answers none)."""
        return self._each(lambda fault, at: fault.on_h2_deadline(at), now)

    def deadline(self) -> float | None:
        """The earliest of the faults' deadlines, asked afresh: a send credit asked for
        (`credit`) may start a stall, and with it a deadline, between two events."""
        return earliest([fault.h2_deadline() for fault in self.faults])

    def credit(self, stream_id: int, now: float) -> int | None:
        """The smallest send credit a fault grants the stream now (None: the windows')."""
        granted = [
            credit
            for credit in (fault.send_credit(stream_id, now) for fault in self.faults)
            if credit is not None
        ]
        return min(granted) if granted else None

    def _each(self, hook: Hook, now: float) -> Effects:
        commands = tuple(command for fault in self.faults for command in hook(fault, now))
        return Effects([], wake=self.deadline(), commands=commands)
