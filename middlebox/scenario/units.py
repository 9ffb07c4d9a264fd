"""Units in scenario YAML: durations (`800ms`, `2s`, `1.5min`) and sizes (`512B`, `4KiB`).

A bare number is seconds, a bare integer is bytes. Binary prefixes (KiB, MiB, GiB) are
powers of 1024 and decimal ones (KB, MB, GB) powers of 1000, as IEC 80000-13 writes them,
so `4KiB` is nginx's `4k` buffer. Pure: no YAML, no I/O.
"""

from __future__ import annotations

import re

DURATION_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|min|h)?\s*$")
SIZE_PATTERN = re.compile(r"^\s*([0-9]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
SECONDS_PER_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, None: 1.0}
BYTES_PER_UNIT = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    None: 1,
}


def parse_duration(value: object) -> float:
    """`250ms` → 0.25; a bare number is seconds. Raises ValueError with the valid units."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 250ms, 2s or 1.5min, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = DURATION_PATTERN.match(str(value))
        if not match:
            raise ValueError(
                f"expected a duration such as 250ms, 2s or 1.5min (units us, ms, s, min, h), "
                f"got {value!r}"
            )
        seconds = float(match.group(1)) * SECONDS_PER_UNIT[match.group(2)]
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def parse_size(value: object) -> int:
    """`4KiB` → 4096; a bare integer is bytes. Raises ValueError with the valid units."""
    if isinstance(value, bool | float):
        raise ValueError(f"expected a size such as 512B, 4KiB or 1MiB, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = SIZE_PATTERN.match(str(value))
        if not match:
            raise ValueError(
                f"expected a size such as 512B, 4KiB or 1MiB (units B, KiB, MiB, GiB, KB, MB, "
                f"GB), got {value!r}"
            )
        size = int(match.group(1)) * BYTES_PER_UNIT[match.group(2)]
    if size < 0:
        raise ValueError(f"a size cannot be negative, got {value!r}")
    return size
