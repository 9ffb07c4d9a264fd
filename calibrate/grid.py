"""The calibration over the stream-shape grid (calibrate/shapes.py): each preset and its
real proxy on every shape, played by one `FixedUpstream`, judged measure by measure.

A stream shape gets the stream measures (first byte, first event, bursts with a gap of
half the shape's period, median burst, largest gap, how it ended, token events the
client got); a cancelling shape gets the abandon measures (how long the upstream took to
learn, the frames written after the client left, what the client saw). The same
tolerances as the single-shape calibration (calibrate/compare.py), in docs/calibration.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from calibrate import compare, probe, proxies
from calibrate.shapes import GRID, TIMEOUT_SHAPES, FixedUpstream, Shape, prompt_for

PROBE_SLACK = 5.0  # seconds beyond the shape's own duration before a probe gives up
LEDGER_WAIT = 5.0  # seconds for the upstream to learn that a cancelling client left
STREAM_COLUMNS = ("first_byte", "first_event", "bursts", "median_burst", "largest_gap",
                  "stream_end", "tokens")  # fmt: skip
ABANDON_COLUMNS = ("abandon_latency", "abandon_tokens", "client")
# The fixed-frame upstream writes exactly `frames` events, so the token events a client
# got are judged too (the emulator may merge tokens into one chunk when it runs late).
GRID_EXACT = (*compare.EXACT, "tokens")


def measure_shape(port: int, upstream: FixedUpstream, shape: Shape, tag: str) -> dict[str, Any]:
    """One probe of `shape` through the proxy at `port`, with how late the upstream's
    writes ran (`upstream_lateness`: the take's disturbance, see `disturbance`)."""
    prompt = prompt_for(shape, tag)
    limit = shape.duration + PROBE_SLACK
    if shape.cancel is None:
        reads = probe.stream(port, shape.frames, limit=limit, prompt=prompt)
        measured = compare.stream_measures(reads, probe.decode(reads), gap=shape.period / 2)
        # read as the client finished: the writes that made what it saw (a timeout shape's
        # upstream may sleep on for seconds before it learns the proxy left)
        entry = upstream.ledger(tag)
    else:
        reads = probe.stream(
            port, shape.frames, limit=limit, prompt=prompt,
            abandon_after=shape.cancel_after, abandon_by=shape.cancel,
        )  # fmt: skip
        entry = settled_entry(upstream, tag)
        measured = compare.abandon_measures(reads, probe.decode(reads), entry)
    return {
        **measured,
        "upstream_lateness": worst_lateness(entry),
        "request_delay": request_delay(reads, entry),
    }


def worst_lateness(entry: dict[str, Any]) -> float:
    """The latest any of the upstream's writes ran against its schedule (seconds)."""
    return max(entry.get("lateness") or [], default=0.0)


def request_delay(reads: probe.Reads, entry: dict[str, Any]) -> float:
    """Seconds from the client's request write to the upstream's having it whole (wall
    clocks of one host). No proxy here holds a small request, so this is the machine: a
    proxy process woken late (run 1's preset first byte on haproxy 1KB-10ms, 0.284
    against 0.205 s, with the same 20 frames in its first burst)."""
    received = entry.get("received_at")
    return 0.0 if received is None else max(float(received) - reads.sent_at, 0.0)


def settled_entry(upstream: FixedUpstream, tag: str) -> dict[str, Any]:
    """The upstream's entry for `tag` once it learned the client left or finished
    (bounded by LEDGER_WAIT)."""
    deadline = time.monotonic() + LEDGER_WAIT
    entry = upstream.ledger(tag)
    while time.monotonic() < deadline and not (
        entry.get("disconnected_at") or entry.get("finished_at")
    ):
        time.sleep(0.05)
        entry = upstream.ledger(tag)
    return entry


def measure_all(
    port: int, upstream: FixedUpstream, shapes: Iterable[Shape], side: str
) -> dict[str, dict[str, Any]]:
    return {shape.name: measure_shape(port, upstream, shape, f"{side}-{shape.name}")
            for shape in shapes}  # fmt: skip


def compare_grid(
    preset: str, real: dict[str, dict[str, Any]], mine: dict[str, dict[str, Any]]
) -> list[compare.Row]:
    """Rows labelled `PRESET @ SHAPE`, one per measure both sides have."""
    rows: list[compare.Row] = []
    for shape, measured in real.items():
        label = f"{preset} @ {shape}"
        rows += compare.compare(label, measured, mine.get(shape, {}), GRID_EXACT)
    return rows


def calibrate_grid(
    name: str,
    setup: proxies.Setup,
    path: list[dict[str, Any]],
    root: Path,
    shapes: Iterable[Shape] = GRID,
    middlebox: Any = None,
) -> tuple[dict[str, Any], dict[str, Any], list[compare.Row]]:
    """Every shape through the real proxy, then through `middlebox proxy` with the
    preset (`middlebox` is calibrate.suite.middlebox, passed in to keep one launcher)."""
    chosen = list(shapes)
    with FixedUpstream() as upstream:
        with proxies.running(setup, upstream.port, root / "grid-real") as port:
            real = measure_all(port, upstream, chosen, f"{name}-real")
        with middlebox(root / "grid-mb", name, path, upstream.port) as port:
            mine = measure_all(port, upstream, chosen, f"{name}-preset")
        again = retake(chosen, compare_grid(name, real, mine))
        if again:
            with proxies.running(setup, upstream.port, root / "grid-real-2") as port:
                real_2 = measure_all(port, upstream, again, f"{name}-real-2")
            with middlebox(root / "grid-mb-2", name, path, upstream.port) as port:
                mine_2 = measure_all(port, upstream, again, f"{name}-preset-2")
            for shape in again:
                real[shape.name] = least_disturbed(real[shape.name], real_2[shape.name])
                mine[shape.name] = least_disturbed(mine[shape.name], mine_2[shape.name])
    return real, mine, compare_grid(name, real, mine)


def retake(shapes: list[Shape], rows: list[compare.Row]) -> list[Shape]:
    """The shapes with a measure outside its tolerance: taken again on both sides
    (docs/calibration.md, "Load")."""
    failed = {row.preset.split(" @ ", 1)[1] for row in rows if not row.ok}
    return [shape for shape in shapes if shape.name in failed]


def disturbance(take: dict[str, Any]) -> tuple[float, ...]:
    """How much the machine disturbed one take (smaller is cleaner), judged on the take
    alone and on the machine's side of it, never on what the proxy did: a proxy's own
    holding makes gaps and bursts in every take (pause-600ms through HAProxy: a 10th frame
    split off the head's burst makes the largest gap smaller, 0.616 s against 0.821 s,
    so "the smaller gap" preferred the take a late frame had split).

    A stream: fewer token events first (a take that lost the stream, say to a port
    another process took, is no cleaner for its quiet upstream), then how late the
    upstream's writes ran against their schedule (`upstream_lateness`: a stall of the
    machine makes a write late) plus how long the request took to reach the upstream
    (`request_delay`: a proxy process woken late). A cancelling client: those plus its own
    from its last read to its close (`client_delay`: a client late under load closes onto
    the next burst and resets)."""
    lateness = float(take.get("upstream_lateness") or 0.0) + float(take.get("request_delay") or 0.0)
    if "stream_end" in take:
        return (-float(take.get("tokens") or 0), lateness)
    return (lateness + float(take.get("client_delay") or 0.0),)


def least_disturbed(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Of two takes of one shape through one side, the less disturbed, chosen on each side
    alone (never by agreement): what a proxy holds shows in both takes. The result says
    it was taken twice."""
    kept = min((first, second), key=disturbance)
    return {**kept, "takes": 2}


READ_TIMEOUT = 1.0  # seconds: the timeout shapes' read timeout, on both sides
# Caddy sets no read timeout by default; with a transport `read_timeout` it ends a started
# stream cleanly (faults/presets.py): the preset side writes that as the idle_reaper option.
CADDY_READ_TIMEOUT = [{"idle_reaper": {"timeout": "1000ms", "after_headers": "finish"}}]


def calibrate_timeouts(
    name: str,
    setup: proxies.Setup,
    path: list[dict[str, Any]],
    root: Path,
    middlebox: Any,
) -> tuple[dict[str, Any], dict[str, Any], list[compare.Row]]:
    """TIMEOUT_SHAPES through the real proxy with its read timeout at READ_TIMEOUT and
    through the preset with its idle_reaper's at the same (`path` already overridden);
    how each stream ended (with the status) and the token events the client got."""
    timed = proxies.Setup(setup.software, setup.buffering, setup.gzip, READ_TIMEOUT)
    if not any("idle_reaper" in entry for entry in path):
        path = [*path, *CADDY_READ_TIMEOUT]
    return calibrate_grid(name, timed, path, root / "timeouts", TIMEOUT_SHAPES, middlebox)


def render_grid(rows: list[compare.Row], twice: frozenset[str] = frozenset()) -> str:
    """One line per preset and shape, a cell per measure: `real / preset`, a ✗ where
    they disagree beyond the tolerance; `twice`: the `PRESET @ SHAPE` labels taken twice."""
    cells: dict[str, dict[str, compare.Row]] = {}
    for row in rows:
        cells.setdefault(row.preset, {})[row.measure] = row
    columns = (*STREAM_COLUMNS, *ABANDON_COLUMNS)
    lines = [
        "| preset @ shape | " + " | ".join(c.replace("_", " ") for c in columns) + " | agree |",
        "|---|" + "---|" * (len(columns) + 1),
    ]
    for label, measures in cells.items():
        shown = []
        label = f"{label} (2 takes)" if label in twice else label
        for column in columns:
            cell = measures.get(column)
            if cell is None:
                shown.append("")
                continue
            text = f"{compare.shown(cell.real)} / {compare.shown(cell.preset_value)}"
            shown.append(text if cell.ok else f"**{text} ✗**")
        agree = all(row.ok for row in measures.values())
        lines.append(f"| {label} | " + " | ".join(shown) + f" | {'yes' if agree else 'NO'} |")
    return "\n".join(lines)
