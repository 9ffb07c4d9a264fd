"""`HopClose`: a FIN a hop sends because it gave up (its read timeout), not the upstream's.

nginx tells the two apart and so must the faults that imitate it: on the upstream's end
of a close-delimited body (`proxy_http_version 1.0`) the pipe passes every buffer on
and the response completes; on `proxy_read_timeout` ngx_http_upstream_process_upstream
sets `p->upstream_error` without reading again, so the partly filled raw buffer never
reaches the input filter, and ngx_http_upstream_finalize_request only sends
`NGX_HTTP_FLUSH` (the write filter and gzip filter flush what they hold) before closing.

`HopClose` is an `Eof` in every other respect: the shell shuts the socket the same way
and it compares equal to `Eof` of the same direction, so a fault that does not care
sees a plain FIN.
"""

from __future__ import annotations

from dataclasses import dataclass

from middlebox.core.stream import Eof, Item


@dataclass(frozen=True, slots=True, eq=False)
class HopClose(Eof):
    """A FIN toward `direction` from a hop that timed out or gave up (see module doc)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Eof) and other.direction is self.direction

    def __hash__(self) -> int:
        return hash((self.direction,))  # as the dataclass hashes Eof


def is_hop_close(item: Item) -> bool:
    """True for the FIN of a hop that gave up, False for an upstream's own end."""
    return isinstance(item, HopClose)
