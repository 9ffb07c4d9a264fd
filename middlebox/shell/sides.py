"""The two sockets of a relayed connection (`Side`: its outbox and how far each way has
ended), and how the shell ends a socket and sizes its buffers: an RST is SO_LINGER(1, 0)
then close (RFC 793's abort), where a plain close would send a FIN."""

from __future__ import annotations

import socket
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from middlebox.core.stream import Direction, Eof, Reset
from middlebox.observe.observer import RelayObserver

_LINGER_ABORT = struct.pack("ii", 1, 0)
# On the read hub no task parks: its relays' sides (and the relays) share this lot, which
# nobody parks on, rather than making a ParkingLot each per connection; a relay that falls
# back to tasks (no fd for the hub's epoll) gives each its own (`Relay.run`).
UNPARKED = trio.lowlevel.ParkingLot()


@dataclass(eq=False)
class Side:
    """One socket of a connection. `source` is the direction of the items it produces."""

    leg: str
    sock: socket.socket
    source: Direction
    outbox: deque[bytes] = field(default_factory=deque)
    outbox_bytes: int = 0
    pending_end: Eof | Reset | None = None
    read_done: bool = False
    read_fin: bool = False  # what it sent ended with a FIN, not an RST
    write_done: bool = False
    closed: bool = False
    # Its writes wait for the end of the hub's turn (`ReadHub.write_soon`); the hub's
    # callback for that, made on first use.
    write_pending: bool = False
    write_later: Callable[[], None] | None = None
    writer_lot: trio.lowlevel.ParkingLot = UNPARKED

    def send_queued(self, observer: RelayObserver | None, clock: Callable[[], float]) -> bool:
        """Send what the socket takes now of the outbox, without blocking (the observer
        sees each byte sent); False when the write failed (EPIPE, ECONNRESET)."""
        sock, outbox = self.sock, self.outbox
        while outbox:
            data = outbox[0]
            try:
                sent = sock.send(data)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if observer is not None:
                observer.wrote(self.leg, self.source.opposite, data[:sent], clock())
            self.outbox_bytes -= sent
            if sent < len(data):
                outbox[0] = data[sent:]
                return True
            outbox.popleft()
        return True


def arm_reset(sock: socket.socket) -> None:
    """Make the socket's close send an RST instead of a FIN (SO_LINGER, zero timeout)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
    except OSError:
        pass  # already closed


def abort(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN (SO_LINGER with a zero timeout)."""
    arm_reset(sock)
    trio.lowlevel.notify_closing(sock)
    sock.close()


def apply_buffer_sizes(
    client: socket.socket, upstream: socket.socket, sizes: dict[str, int]
) -> None:
    """Set the SO_RCVBUF/SO_SNDBUF sizes a fault asked for (see Fault.socket_buffers)."""
    options = {"rcvbuf": socket.SO_RCVBUF, "sndbuf": socket.SO_SNDBUF}
    for key, size in sizes.items():
        side, _, which = key.partition("_")
        sock = client if side == "client" else upstream
        sock.setsockopt(socket.SOL_SOCKET, options[which], size)
