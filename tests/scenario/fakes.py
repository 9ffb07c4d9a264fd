"""A tiny registry for testing the scenario room on its own, without faults/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from middlebox.core.fault import Bytes, Fault, Seconds


@dataclass
class Delay(Fault):
    """Holds every item for `delay`."""

    name = "delay"
    delay: Seconds = 0.0
    mode: Literal["fixed", "jitter"] = "fixed"

    def __post_init__(self) -> None:
        if self.delay > 60:
            raise ValueError("delay above 60s is a stall, not a delay")


@dataclass
class Cut(Fault):
    """Cuts the response after `after_events` SSE events or `at` seconds."""

    name = "cut"
    after_events: int | None = None
    at: Seconds | None = None
    buffer: Bytes = 4096


REGISTRY: dict[str, type[Fault]] = {"delay": Delay, "cut": Cut}
PRESETS = {
    "slow-hop": "- delay: {delay: 200ms}\n- cut: {buffer: 1KiB}\n",
    "broken-hop": "- delay: {delay: 2h}\n",
}
