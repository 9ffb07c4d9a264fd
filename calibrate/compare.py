"""What is compared between a real proxy and its preset, and how close is close enough.

Pure: the numbers come from `probe` reads and the emulator's ledger; this module turns
them into measures and verdicts. A burst is a run of reads each within `BURST_GAP` of
the previous one (a client that renders per read sees one update per burst).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibrate.probe import Decoded, Reads

BURST_GAP = 0.010  # reads closer than this are one burst


@dataclass(frozen=True)
class Tolerance:
    """|real - preset| <= max(absolute, relative * |real|)."""

    absolute: float
    relative: float

    def accepts(self, real: float, preset: float) -> bool:
        return abs(real - preset) <= max(self.absolute, self.relative * abs(real))

    def describe(self, unit: str) -> str:
        return f"±{self.absolute:g}{unit} or ±{self.relative:.0%}"


# The stated tolerances (docs/calibration.md). Timings are on a shared machine, on
# loopback, through one more process (middlebox) on the preset's side.
TOLERANCES: dict[str, tuple[Tolerance, str]] = {
    "first_byte": (Tolerance(0.05, 0.20), "s"),
    "first_event": (Tolerance(0.05, 0.20), "s"),
    "bursts": (Tolerance(1, 0.20), ""),
    "median_burst": (Tolerance(256, 0.20), "B"),
    "largest_gap": (Tolerance(0.05, 0.25), "s"),
    "abandon_latency": (Tolerance(0.05, 0.25), "s"),
    "abandon_tokens": (Tolerance(3, 0.25), ""),
    # Tokens the client got before the idle end: judged since proxy_buffering drops its
    # partial buffer on a hop's read timeout as nginx does (ngx_http_upstream.c).
    "idle_tokens": (Tolerance(1, 0.10), ""),
}
EXACT = ("stream_end", "idle_end")  # must be identical
SHOWN: tuple[str, ...] = ()  # reported, not judged: none (every measure is judged)


def bursts(reads: Reads, gap: float = BURST_GAP) -> list[int]:
    """Sizes of the bursts: reads separated by more than `gap` start a new one."""
    sizes: list[int] = []
    last: float | None = None
    for when, size in zip(reads.times, reads.sizes, strict=True):
        if last is None or when - last > gap:
            sizes.append(0)
        sizes[-1] += size
        last = when
    return sizes


def largest_gap(reads: Reads) -> float:
    """The longest silence between two reads after the first byte."""
    return max((b - a for a, b in zip(reads.times, reads.times[1:], strict=False)), default=0.0)


def end_kind(reads: Reads, decoded: Decoded) -> str:
    """How the stream ended as a client sees it, with the status when it is not 200.

    complete: the HTTP message ended and `[DONE]` came; fin-no-done: the message ended
    (terminal chunk, or the close of a close-delimited body) without `[DONE]`, the
    silent truncation; truncated: the connection closed inside the message; reset;
    hang: nothing ended it within the bound."""
    if reads.end == "reset":
        kind = "reset"
    elif reads.end == "timeout":
        kind = "hang"
    elif decoded.message_complete:
        kind = "complete" if decoded.done else "fin-no-done"
    else:
        kind = "truncated"
    if decoded.status is not None and decoded.status != 200:
        return f"{decoded.status} {kind}"
    return kind


def stream_measures(reads: Reads, decoded: Decoded, gap: float = BURST_GAP) -> dict[str, Any]:
    """`gap`: the burst gap; a stream whose frames come every 10 ms needs a wider one
    than BURST_GAP, or every gap between two frames is a coin toss (the grid uses half
    the shape's period: calibrate/grid.py)."""
    sizes = bursts(reads, gap)
    return {
        "first_byte": reads.times[0] if reads.times else None,
        "first_event": decoded.first_event_at,
        "bursts": len(sizes),
        "median_burst": sorted(sizes)[len(sizes) // 2] if sizes else 0,
        "burst_sizes": sizes,
        "largest_gap": largest_gap(reads),
        "tokens": decoded.tokens,
        "stream_end": end_kind(reads, decoded),
    }


def abandon_measures(reads: Reads, decoded: Decoded, ledger: dict[str, Any]) -> dict[str, Any]:
    """How fast, and after how many more tokens, the upstream learned the client left.

    None latency: it never learned (generated to the end); a client that got the whole
    stream before it could abandon (a hop that holds everything) says so in `client`."""
    closed = reads.closed_wall
    if closed is None:
        return {"client": end_kind(reads, decoded), "abandon_latency": None,
                "abandon_tokens": 0, "client_tokens": decoded.tokens}  # fmt: skip
    if decoded.done:
        # The hop held everything: the first readable token came with [DONE].
        return {"client": "got all first", "abandon_latency": None, "abandon_tokens": 0,
                "client_tokens": decoded.tokens}  # fmt: skip
    learned = ledger.get("aborted_at") or ledger.get("disconnected_at")
    after = sum(1 for t in ledger.get("token_times", []) if t > closed)
    last_read = reads.times[-1] if reads.times else 0.0
    return {
        "client": "abandoned",
        "abandon_latency": None if learned is None else max(0.0, learned - closed),
        "abandon_tokens": after,
        "client_tokens": decoded.tokens,
        # seconds from the read that gave it its tokens to the close (the client's own lag)
        "client_delay": max(0.0, (reads.ended_at or last_read) - last_read),
    }


@dataclass(frozen=True)
class Row:
    preset: str
    measure: str
    real: Any
    preset_value: Any
    tolerance: str
    ok: bool


def compare(
    preset: str, real: dict[str, Any], mine: dict[str, Any], exact: tuple[str, ...] = EXACT
) -> list[Row]:
    """One row per measure both sides have; `exact` measures must be equal."""
    rows = []
    for measure, (tolerance, unit) in TOLERANCES.items():
        if measure not in real and measure not in mine:
            continue
        a, b = real.get(measure), mine.get(measure)
        if a is None or b is None:
            ok = a is None and b is None
        else:
            ok = tolerance.accepts(float(a), float(b))
        rows.append(Row(preset, measure, a, b, tolerance.describe(unit), ok))
    for measure in (*exact, "client"):
        if measure in real or measure in mine:
            a, b = real.get(measure), mine.get(measure)
            rows.append(Row(preset, measure, a, b, "identical", a == b))
    for measure in SHOWN:
        if measure in real or measure in mine:
            rows.append(Row(preset, measure, real.get(measure), mine.get(measure), "shown", True))
    return rows


def shown(value: Any) -> str:
    if value is None:
        return "never"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
