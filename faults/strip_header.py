"""strip_header: drop named header fields from matched responses (or requests).

Imitates a hop that removes fields it considers hop-by-hop or private: a CDN or
ingress that drops `X-Accel-Buffering` (nginx consumes it by default,
`proxy_ignore_headers`/`proxy_hide_header`, and never forwards it), so a second
buffering proxy further out no longer sees the server's "do not buffer" hint; or a
gateway that strips `Cache-Control: no-cache` or `Content-Type`'s charset. Only the
head is rewritten (with `middlebox.core.http1.build_head`); every other byte passes as it
came, and a head without the fields passes untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from faults._lib.checks import check_field_names
from faults._lib.heads import HeadRewriter
from middlebox.core.fault import Fault
from middlebox.core.http1 import Head, rebuilt_head

__all__ = ["StripHeader"]


@dataclass
class StripHeader(HeadRewriter, Fault):
    """Remove the fields named in `headers` (case-insensitive) from matched heads."""

    name: ClassVar[str] = "strip_header"

    headers: list[str] = field(default_factory=lambda: ["X-Accel-Buffering"])

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.headers:
            raise ValueError("headers must name at least one field to strip")
        check_field_names(self.headers)

    def rewrite(self, head: Head) -> tuple[Head, dict[str, Any]] | None:
        names = {name.lower() for name in self.headers}
        present = [name for name, _ in head.headers if name.lower() in names]
        if not present:
            return None
        return rebuilt_head(head, remove_headers=self.headers), {"stripped": present}
