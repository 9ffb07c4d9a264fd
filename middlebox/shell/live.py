"""What graceful shutdown and a reset need of each live connection (`LiveConnection`),
whether a handler task (`ProxyServer.handle`) or the read hub (`HubConnection`) serves it."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

from middlebox.shell.relay import Relay
from middlebox.shell.sides import arm_reset


@dataclass(eq=False)
class LiveConnection:
    """What shutdown needs to reset one connection: its sockets and how to stop it (its
    task's cancel scope, or a hub-served connection's close)."""

    stop: Callable[[], None]
    sockets: list[socket.socket]
    relay: Relay | None = None  # once relaying: graceful shutdown asks it if it is idle
    closing: bool = False
    on_hub: bool = False  # a HubConnection: no task of its own closes it when serve ends

    def close_if_idle(self) -> bool:
        """A FIN both ways at once when the connection is between messages (nginx's
        graceful shutdown, `ngx_close_idle_connections`); True when it closed it."""
        if self.closing or self.relay is None or not self.relay.between_messages():
            return False
        self.closing = True
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the peer is gone already
        self.stop()  # the relay closes both sockets: nothing is unread, so a FIN
        return True

    def reset(self) -> None:
        for sock in self.sockets:
            arm_reset(sock)
        self.stop()
