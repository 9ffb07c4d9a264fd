"""set_header: set header fields on matched responses (or requests).

Imitates a hop that adds or overrides fields: an ingress annotation or a gateway
policy that adds `X-Accel-Buffering: no` so nginx streams (nginx honours it per
response, ngx_http_upstream_process_buffering), a CDN that sets `Cache-Control`, or a
proxy that rewrites `Connection`/`Content-Type`. A field already present has its
first occurrence replaced in place and its repeats dropped; a missing one is
appended (`middlebox.core.http1.build_head`). Every other byte passes as it came, and a
head that already carries the values passes untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from faults._lib.checks import check_field_names
from faults._lib.heads import HeadRewriter
from middlebox.core.fault import Fault
from middlebox.core.http1 import Head, rebuilt_head

__all__ = ["SetHeader"]


@dataclass
class SetHeader(HeadRewriter, Fault):
    """Set each `headers` field (name: value) on matched heads."""

    name: ClassVar[str] = "set_header"

    # YAML 1.1 reads an unquoted `no` as false; such values are written back as the
    # header words they stand for (`X-Accel-Buffering: no` must work unquoted).
    headers: dict[str, str | bool | int] = field(
        default_factory=lambda: {"X-Accel-Buffering": "no"}
    )

    _values: dict[str, str] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.headers:
            raise ValueError("headers must set at least one field")
        check_field_names(list(self.headers))
        self._values = {name: header_text(value) for name, value in self.headers.items()}
        for name, value in self._values.items():
            # RFC 9110 §5.5: a field value is visible latin-1 text, spaces and tabs; a CR or
            # LF would split the head (request smuggling), so it is refused.
            if not all(c == "\t" or (c.isprintable() and ord(c) < 256) for c in value):
                raise ValueError(
                    f"header {name!r}: value {value!r} has control or non-latin-1 characters"
                )

    def rewrite(self, head: Head) -> tuple[Head, dict[str, Any]] | None:
        if all(head.header_values(name) == [value] for name, value in self._values.items()):
            return None
        return rebuilt_head(head, set_headers=self._values), {"set": dict(self._values)}


def header_text(value: str | bool | int) -> str:
    """A config value as header text: booleans as `yes`/`no` (YAML 1.1's spellings)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
