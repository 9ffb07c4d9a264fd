"""The canary's reading of one round, and the watch's state across rounds, from plain data.

`middlebox fingerprint URL --watch INTERVAL` (middlebox/tools/fingerprint_watch.py) repeats
a small, cheap part of the fingerprint's grid: one hold shape (`CANARY_HOLD`, about a
second of 256-byte frames) and one client that leaves after a few frames. The grid runner
(`middlebox.tools.fingerprint.canary`) hands back the existing measures of both, `hold` and
`leave` of middlebox/scenario/fingerprint.py, and this module reads the three numbers a
dashboard plots from them:

- added TTFT: how much later than the probe's planned first frame the client read it,
  beyond the stream's transit (`first_frame_wait`): a buffer that starts holding after a
  deploy makes the first token wait until the buffer fills;
- bytes held: the upstream's bytes (head and chunk framing counted, as a proxy's buffer
  counts what it reads) the client got in the first release, when the path held the
  stream; 0 when it held nothing; unknown when the stream did not arrive whole;
- cancel propagation: how long after the client closed the probe upstream learned it (an
  LLM server keeps generating, and billing, until it does); "at least" the watch's wait
  when it never did.

`Watch` counts rounds and failures and keeps the last reading and the last success's time,
so a dead path shows on the dashboard as a stale success and a rising failure count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from middlebox.scenario.fingerprint import HOLD_A

# The fingerprint's first hold shape (48 frames of 256 bytes every 20 ms, ~13 KiB of the
# upstream's response): long enough that nginx's 4 KiB buffer releases three times before
# the end, short enough for a round every few seconds.
CANARY_HOLD = HOLD_A


@dataclass(frozen=True)
class Reading:
    """One round's numbers; None where the round could not tell."""

    added_ttft: float | None  # seconds beyond the transit
    bytes_held: int | None
    cancel_seconds: float | None  # until the upstream learned, or the wait when it never did
    cancel_learned: bool | None

    def line(self) -> str:
        """The round's one line of numbers, as the watch prints it."""
        ttft = "?" if self.added_ttft is None else f"{self.added_ttft:.3f} s"
        held = "?" if self.bytes_held is None else f"{self.bytes_held} B"
        if self.cancel_seconds is None:
            cancel = "?"
        elif self.cancel_learned:
            cancel = f"{self.cancel_seconds:.3f} s"
        else:
            cancel = f"not learned in {self.cancel_seconds:.1f} s"
        return f"added TTFT {ttft}, held {held}, cancel {cancel}"


def reading(hold: Mapping[str, Any], leave: Mapping[str, Any] | None) -> Reading:
    """The round's numbers from the `hold` of `CANARY_HOLD` and the `leave` measure (None
    when the round had no time left for it)."""
    release = hold["release"]
    if release == "incomplete":
        held: int | None = None
    elif release == "none":
        held = 0
    else:
        held = int(hold["bursts"][0]["bytes"])
    wait = hold.get("first_frame_wait")
    ttft = None if wait is None else max(float(wait), 0.0)
    if leave is None:
        return Reading(ttft, held, None, None)
    if leave["learned"]:
        return Reading(ttft, held, float(leave["after"]), True)
    return Reading(ttft, held, float(leave["at_least"]), False)


@dataclass
class Watch:
    """What the watch knows after its rounds: the last reading, when a round last
    succeeded (wall-clock seconds, None before the first), the counts, the last error."""

    rounds: int = 0
    failures: int = 0
    last: Reading | None = None
    last_success: float | None = None
    last_round_seconds: float | None = None
    up: bool = False
    error: str | None = None

    def succeeded(self, found: Reading, at: float, took: float) -> None:
        self.rounds += 1
        self.last, self.last_success, self.last_round_seconds = found, at, took
        self.up, self.error = True, None

    def failed(self, error: str, took: float) -> None:
        # the last reading stays: a scrape after a failure shows the last numbers measured,
        # and `up`, the failure count and the last success's age say they are stale
        self.rounds += 1
        self.failures += 1
        self.last_round_seconds = took
        self.up, self.error = False, error
