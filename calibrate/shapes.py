"""The stream shapes the presets are calibrated over, and the upstream that plays them.

One stream shape (the emulator at 20 ms, ~250-byte frames) hides what a preset gets wrong
on others: a 4 KiB `proxy_buffering` slab fills after 136 frames of 30 bytes
but after 4 of 1 KiB; a cork that holds one segment splits 1 KiB frames where it merges
30-byte ones; a pause before the head is a prefill, one after it an idle stream that a
proxy may or may not hold; a client cancels with a FIN (drained first) or an RST.

`GRID` is those shapes. `FixedUpstream` is the product's probe upstream
(`middlebox probe-upstream`, middlebox/tools/probe_upstream.py) in this process: it writes
exactly the shape's frames on its schedule (not the emulator's tokenizer, not its
jitter), answers an HTTP/1.0 request (nginx's default `proxy_http_version 1.0`)
close-delimited and an HTTP/1.1 one chunked, as uvicorn does, and stops writing as soon
as it learns the client left (EOF or an RST on its read side, or a failed write), as
vLLM aborts on disconnect. `ledger(tag)` reads its record of a request in the emulator's
ledger shape (`received_at`, `token_times`, `disconnected_at`, `finished_at`,
`lateness`), so the abandon measures read both upstreams the same way.

The shape travels in the request's `prompt` as the probe's knobs, tagged with the
request's id: `middlebox-probe: frames=...;id=TAG` (`prompt_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from middlebox.scenario.probe_shape import PROMPT_MARK, ProbeShape, frame, smallest_frame
from middlebox.tools.probe_upstream import ProbeUpstream

FRAME_OVERHEAD = smallest_frame("text", "", "")  # the smallest frame: an empty text


@dataclass(frozen=True)
class Shape:
    """One stream: `frames` SSE events of exactly `frame_bytes` bytes, one every
    `period` seconds; optionally a pause before the head (prefill) or after frame
    `pause_after` (with `heartbeat` comments every so many seconds while it lasts); and a
    client that cancels after `cancel_after` token events by `cancel` ("fin" or "rst")."""

    name: str
    frame_bytes: int
    period: float
    frames: int
    pause_before_head: float = 0.0
    pause_after: int | None = None
    pause: float = 0.0
    heartbeat: float | None = None
    cancel: str | None = None
    cancel_after: int | None = None

    def __post_init__(self) -> None:
        if self.frame_bytes < FRAME_OVERHEAD:
            raise ValueError(f"{self.name}: a frame is at least {FRAME_OVERHEAD} bytes")
        if (self.cancel is None) != (self.cancel_after is None):
            raise ValueError(f"{self.name}: cancel and cancel_after go together")
        if self.cancel not in (None, "fin", "rst"):
            raise ValueError(f"{self.name}: cancel is 'fin' or 'rst', not {self.cancel!r}")

    def frame(self, index: int) -> bytes:
        """Frame `index`: a `data:` event of exactly `frame_bytes` bytes whose JSON text
        is seeded letters and digits (seed: the frame's number), so frames differ, sizes
        stay exact and a gzip hop compresses them about as much as model text (a
        repeated pad would shrink 100-fold and hide when a compressed buffer fills)."""
        return frame(index, self.frame_bytes, "text")

    def probe(self, tag: str) -> ProbeShape:
        """The probe upstream's knobs for this shape (the cancel is the client's)."""
        return ProbeShape(
            frames=self.frames, size=self.frame_bytes, period=self.period,
            head_delay=self.pause_before_head, pause_after=self.pause_after, pause=self.pause,
            heartbeat=self.heartbeat, format="text", id=tag,
        )  # fmt: skip

    @property
    def duration(self) -> float:
        """How long the upstream takes to write the whole stream (seconds)."""
        return self.pause_before_head + self.frames * self.period + self.pause


GRID: tuple[Shape, ...] = (
    # frame sizes from a single-character completions stream to a re-framing gateway
    Shape("30B-10ms", frame_bytes=30, period=0.010, frames=150),
    Shape("60B-20ms", frame_bytes=60, period=0.020, frames=100),
    Shape("250B-20ms", frame_bytes=250, period=0.020, frames=60),
    Shape("1KB-10ms", frame_bytes=1024, period=0.010, frames=150),
    Shape("1KB-100ms", frame_bytes=1024, period=0.100, frames=20),
    # Every other shape's frames sit on a 200 ms grid from the head (periods 10, 20, 100
    # ms; the 10th frame before a pause or a cancel at 200 ms), on the edge of HAProxy's
    # cork (one RTO, 204 ms on loopback: docs/calibration.md), where a few ms of scheduling
    # decide which burst a frame joins. At 170 ms each cork takes two frames, 34 ms inside
    # its edge, the next frame 136 ms past it: the cork judged without the coin.
    Shape("250B-170ms", frame_bytes=250, period=0.170, frames=12),
    # a prefill before the head, an idle pause after it, the same pause kept alive
    Shape("prefill-800ms", frame_bytes=250, period=0.020, frames=40, pause_before_head=0.8),
    Shape("pause-600ms", frame_bytes=250, period=0.020, frames=40, pause_after=10, pause=0.6),
    Shape("pause-600ms-comments", 250, 0.020, 40, pause_after=10, pause=0.6, heartbeat=0.1),
    # cancellation by FIN (the client drains first) and by RST, after 10 frames
    Shape("cancel-fin", frame_bytes=250, period=0.020, frames=200, cancel="fin", cancel_after=10),
    Shape("cancel-rst", frame_bytes=250, period=0.020, frames=200, cancel="rst", cancel_after=10),
)
# Played with the read timeout the preset's idle_reaper stands for set to 1 s on both
# sides (calibrate/grid.py): a timeout before the head (nginx and HAProxy 504, Apache 502
# AH01102) and after it (a close without the terminal chunk; Caddy's `read_timeout` a
# clean terminal chunk without [DONE], the idle_reaper's `after_headers: finish`).
TIMEOUT_SHAPES: tuple[Shape, ...] = (
    Shape("timeout-before-head", frame_bytes=250, period=0.020, frames=10, pause_before_head=2.5),
    Shape("timeout-after-head", 250, 0.020, frames=20, pause_after=10, pause=2.5),
)
SHAPES = {shape.name: shape for shape in (*GRID, *TIMEOUT_SHAPES)}


def prompt_for(shape: Shape, tag: str) -> str:
    """The prompt that asks the probe upstream for `shape`, recorded under `tag`."""
    return f"{PROMPT_MARK} {shape.probe(tag).render()}"


class FixedUpstream:
    """The probe upstream on a free loopback port (see the module docstring). `port` once
    started; `ledger(tag)` is the record of the request with that tag, or {}."""

    def __init__(self) -> None:
        self._server = ProbeUpstream("127.0.0.1", 0)
        self.port: int = self._server.port

    def __enter__(self) -> FixedUpstream:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.close()

    def ledger(self, tag: str) -> dict[str, Any]:
        """The record in the emulator's ledger shape: wall-clock times of the request,
        each frame written, the leave learned (`disconnected_at`) and the last write of
        a finished stream (`finished_at`), and each write's lateness (seconds)."""
        record = self._server.record(tag)
        if record is None:
            return {}
        received = float(record["received_at"])
        writes = record["writes"]
        left = record["client_left"]
        finished = None
        if record["ended"] in ("done", "clean"):
            finished = received + float(record["ended_at"])
        return {
            "prompt": tag,
            "received_at": received,
            "token_times": [received + t for t in writes["frames"]],
            "lateness": list(record["lateness"]),
            "finished_at": finished,
            **({"disconnected_at": received + float(left["at"])} if left else {}),
        }
