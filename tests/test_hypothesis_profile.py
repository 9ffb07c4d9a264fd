"""The suite's Hypothesis profile (tests/conftest.py) is the one in force: no deadline, and
the same examples every run."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

SEEN: list[int] = []


def test_the_profile_has_no_deadline_and_is_derandomized() -> None:
    assert settings.default.deadline is None
    assert settings.default.derandomize is True
    assert settings.default.database is None


@settings(max_examples=20)
@given(st.integers())
def _draw(value: int) -> None:
    SEEN.append(value)


def test_two_runs_of_a_property_draw_the_same_examples() -> None:
    SEEN.clear()
    _draw()
    first = list(SEEN)
    SEEN.clear()
    _draw()
    assert first == SEEN
    assert len(first) > 1
