"""Units in scenario YAML: durations (`800ms`, `2s`, `1.5min`) and sizes (`512B`, `4KiB`).

A duration needs its unit: a bare number is an error ("write 300ms or 300s"), because a
bare 300 means seconds to one reader and milliseconds to another (Toxiproxy's latency is in
ms), and five minutes is not a silent default. Only 0 may be bare: it is zero in every
unit. A bare integer is bytes. Binary prefixes (KiB, MiB, GiB) are
powers of 1024 and decimal ones (KB, MB, GB) powers of 1000, as IEC 80000-13 writes them,
so `4KiB` is nginx's `4k` buffer. Pure: no YAML, no I/O.
"""

from __future__ import annotations

import re

DURATION_PATTERN = re.compile(
    r"^\s*(?:([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|min|h)|(0+(?:\.0*)?))\s*$"
)
_NUMBER = re.compile(r"^\s*[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?\s*$")
SIZE_PATTERN = re.compile(r"^\s*([0-9]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
SECONDS_PER_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
# What a scenario may ask for: a day of delay, a TiB of data. Beyond them a value is a typo
# or a trick (`1e12s`, `1e400s` is infinite) and a request would only hang, so it is refused
# at load with its file:line:col rather than accepted without a word.
MAX_DURATION = 86400.0
MAX_SIZE = 1024**4
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


def bare_number_problem(value: object) -> str:
    """The error for a duration written without its unit, with the two likely meanings."""
    shown = f"{value:g}" if isinstance(value, int | float) else str(value).strip()
    return (
        f"a duration needs a unit: write {shown}ms or {shown}s (units us, ms, s, min, h), "
        f"got the bare number {value!r}"
    )


def parse_duration(value: object) -> float:
    """`250ms` → 0.25. A bare number other than 0 is an error naming both readings.
    Raises ValueError with the valid units."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 250ms, 2s or 1.5min, got {value!r}")
    if isinstance(value, int | float) or _NUMBER.match(str(value)):
        number = float(value) if isinstance(value, int | float) else float(str(value))
        if number == 0:
            return 0.0
        if number < 0:
            raise ValueError(f"a duration cannot be negative, got {value!r}")
        raise ValueError(bare_number_problem(value))
    match = DURATION_PATTERN.match(str(value))
    if not match:
        raise ValueError(
            f"expected a duration such as 250ms, 2s or 1.5min (units us, ms, s, min, h), "
            f"got {value!r}"
        )
    if match.group(3) is not None:
        return 0.0
    seconds = float(match.group(1)) * SECONDS_PER_UNIT[match.group(2)]
    if not seconds <= MAX_DURATION:  # also catches inf (`1e400s`)
        raise ValueError(f"a duration may be at most a day (24h), got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest exact way to write `seconds` with a unit: 0.03 → `30ms`, 60.0 → `60s`."""
    if seconds == 0:
        return "0"
    if seconds < 1e-3:
        return f"{seconds * 1e6:g}us"
    if seconds < 1:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds:g}s"


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
    if size > MAX_SIZE:
        raise ValueError(f"a size may be at most 1TiB (1024GiB), got {value!r}")
    return size
