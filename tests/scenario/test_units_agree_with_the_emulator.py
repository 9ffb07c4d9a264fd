"""The emulator parses `800ms` and `4KiB` with its own copy of the grammar (it may not
import middlebox); these tests keep the two copies from drifting apart."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from middlebox.scenario import units
from vllm_emulator import config as emulator_config


@dataclass(frozen=True)
class Timed:
    """One duration and one size, read by the emulator's converter."""

    wait: emulator_config.Seconds = 0.0
    buffer: emulator_config.Bytes = 0


def test_both_copies_use_the_same_patterns_and_unit_tables() -> None:
    assert emulator_config._SIZE.pattern == units.SIZE_PATTERN.pattern
    assert emulator_config._BYTES == units.BYTES_PER_UNIT
    # The same units; only the emulator reads a bare number (as seconds), because the
    # runner hands it the scenario's durations already converted to seconds, while a
    # scenario must write its unit (a bare 300 is an error: 300ms or 300s?).
    bare = {k: v for k, v in emulator_config._SECONDS.items() if k is not None}
    assert bare == units.SECONDS_PER_UNIT and emulator_config._SECONDS[None] == 1.0
    assert emulator_config._MAX_SECONDS == units.MAX_DURATION
    assert emulator_config._MAX_BYTES == units.MAX_SIZE


@pytest.mark.parametrize(("field", "written"), [("wait", "25h"), ("wait", "1e400s"),
                                                ("wait", 1e12), ("buffer", "1025GiB")])  # fmt: skip
def test_both_copies_refuse_the_same_endless_values(field: str, written: object) -> None:
    with pytest.raises(ValueError, match="at most"):
        emulator_config.config_from_mapping({field: written}, Timed)
    parse = units.parse_duration if field == "wait" else units.parse_size
    if not isinstance(written, float):  # a scenario's bare number is refused for its unit
        with pytest.raises(ValueError, match="at most"):
            parse(written)


@pytest.mark.parametrize("written", ["250us", "800ms", "2s", "1.5min", "2h", ".5s", "1e3ms", 0])
def test_a_duration_means_the_same_in_a_scenario_and_in_an_emulator_config(
    written: object,
) -> None:
    read = emulator_config.config_from_mapping({"wait": written}, Timed)
    assert read.wait == pytest.approx(units.parse_duration(written))


@pytest.mark.parametrize("written", ["512B", "4KiB", "1MiB", "2GiB", "2KB", "3MB", "1GB", 100])
def test_a_size_means_the_same_in_a_scenario_and_in_an_emulator_config(written: object) -> None:
    read = emulator_config.config_from_mapping({"buffer": written}, Timed)
    assert read.buffer == units.parse_size(written)


@pytest.mark.parametrize(
    ("field", "written"), [("wait", "1m"), ("wait", True), ("buffer", "4k"), ("buffer", 1.5)]
)
def test_what_a_scenario_refuses_the_emulator_refuses_too(field: str, written: object) -> None:
    parse = units.parse_duration if field == "wait" else units.parse_size
    with pytest.raises(ValueError):
        parse(written)
    with pytest.raises(ValueError):
        emulator_config.config_from_mapping({field: written}, Timed)
