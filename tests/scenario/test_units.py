"""Units: how `800ms` and `4KiB` read, and what is refused with the valid units named."""

from __future__ import annotations

from pathlib import Path

import pytest

from middlebox.compose import load
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.units import (
    DURATION_PATTERN,
    SIZE_PATTERN,
    format_duration,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ("2h", 7200.0),
        (".5s", 0.5),
        ("1e3ms", 1.0),
        (" 30 s ", 30.0),  # spaces around and between, as YAML authors write them
        ("0", 0.0),  # zero is zero in every unit: the one bare number allowed
        (0, 0.0),
        (0.0, 0.0),
    ],
)
def test_a_duration_reads_exponents_spaces_and_a_bare_zero(written: object, seconds: float) -> None:
    assert parse_duration(written) == pytest.approx(seconds)


def test_a_bare_zero_comes_back_as_a_float() -> None:
    assert type(parse_duration(0)) is float


@pytest.mark.parametrize("written", [300, "300", 1.5, " 2 ", 1e3])
def test_a_bare_number_is_an_error_that_names_both_readings(written: object) -> None:
    # Toxiproxy's latency is in ms, a bare 300 here used to be five minutes: say both.
    shown = f"{written:g}" if isinstance(written, int | float) else str(written).strip()
    with pytest.raises(ValueError, match=rf"write {shown}ms or {shown}s"):
        parse_duration(written)


@pytest.mark.parametrize(
    ("seconds", "written"), [(0.0, "0"), (0.03, "30ms"), (60.0, "60s"), (2e-5, "20us")]
)
def test_a_duration_is_written_back_with_its_unit(seconds: float, written: str) -> None:
    assert format_duration(seconds) == written
    assert parse_duration(written) == pytest.approx(seconds)


@pytest.mark.parametrize("written", [False, -0.5, "2 S", "1m", "1.5.2s", "", None])
def test_booleans_negatives_unknown_or_miscased_units_are_not_durations(written: object) -> None:
    # `1m` is refused rather than guessed: minute or metre, nginx's `1m` means a minute
    # but Go's time.ParseDuration has no `m` alone; `min` says it.
    with pytest.raises(ValueError, match="duration"):
        parse_duration(written)


def test_a_refused_duration_lists_the_units_it_accepts() -> None:
    with pytest.raises(ValueError, match=r"units us, ms, s, min, h"):
        parse_duration("5 fortnights")


@pytest.mark.parametrize(
    ("written", "size"),
    [
        ("1KiB", 1024),
        ("1KB", 1000),  # decimal prefixes are powers of 1000 (IEC 80000-13)
        ("3GiB", 3 * 1024**3),
        ("2MB", 2_000_000),
        (" 16 B ", 16),
        ("0", 0),
        ("4096", 4096),
    ],
)
def test_binary_and_decimal_prefixes_differ_as_their_names_say(written: object, size: int) -> None:
    assert parse_size(written) == size


@pytest.mark.parametrize("written", [1.5, True, "1.5KiB", "4kib", "4k", "-1", -1, "KiB"])
def test_fractions_booleans_negatives_and_unknown_units_are_not_sizes(written: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(written)


def test_a_refused_size_lists_the_units_it_accepts() -> None:
    with pytest.raises(ValueError, match=r"units B, KiB, MiB, GiB, KB, MB, GB"):
        parse_size("4 pages")


@pytest.mark.parametrize("written", ["250ms", "2s", "1.5min", "0", "1e-3s"])
def test_every_written_duration_matches_the_pattern_the_schema_publishes(written: str) -> None:
    assert DURATION_PATTERN.match(written) and parse_duration(written) >= 0


@pytest.mark.parametrize("written", ["3", "1.5", "-2s"])
def test_durations_the_parser_refuses_do_not_match_the_published_pattern(written: str) -> None:
    assert DURATION_PATTERN.match(written) is None


@pytest.mark.parametrize("written", ["4k", "1.5MiB", "-1B"])
def test_sizes_the_parser_refuses_do_not_match_the_published_pattern(written: str) -> None:
    assert SIZE_PATTERN.match(written) is None


@pytest.mark.parametrize("value", ["1e12s", "1e400s", "25h", "1441min", "86400.5s"])
def test_a_duration_beyond_a_day_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=r"at most a day \(24h\)"):
        parse_duration(value)


@pytest.mark.parametrize(("value", "seconds"), [("24h", 86400.0), ("1440min", 86400.0)])
def test_a_day_itself_is_a_duration(value: str, seconds: float) -> None:
    assert parse_duration(value) == seconds


def test_a_size_beyond_a_tebibyte_is_refused() -> None:
    assert parse_size("1024GiB") == 1024**4
    for value in ("1025GiB", 1024**4 + 1, "99999999999999999999B"):
        with pytest.raises(ValueError, match=r"at most 1TiB"):
            parse_size(value)


def test_a_scenario_asking_for_an_endless_delay_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "endless.yaml"
    path.write_text("name: endless\npath:\n  - latency: {delay: 1e400s}\n")
    with pytest.raises(ScenarioError) as raised:
        load(path)
    assert f"{path}:3:22: path[0] latency.delay: a duration may be at most a day" in str(
        raised.value
    )
