"""Configuration checks shared by the faults: clear errors at load time (pure)."""

from __future__ import annotations

import re
from typing import get_args


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise a clear ValueError for a negative (or zero, unless allowed) config number."""
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def check_choice(name: str, value: object, choices: object) -> None:
    """Raise a clear ValueError when `value` is not one of a Literal's choices."""
    allowed = get_args(choices)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")  # RFC 9110 §5.1 field-name


def check_field_names(names: list[str]) -> None:
    """Raise a clear ValueError unless every name is a valid field name (RFC 9110 §5.1)."""
    bad = [name for name in names if not _TOKEN.match(name)]
    if bad:
        raise ValueError(f"header names must be HTTP tokens, got {bad!r}")
