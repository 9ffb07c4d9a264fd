"""The rapid-reset budget (core/h2_limits.py): a token bucket of client RST_STREAMs per
connection, on literal times (no clock)."""

from __future__ import annotations

import pytest

from middlebox.core.h2_limits import RESET_BURST, RESET_RATE, ResetBudget


def test_the_budget_allows_the_burst_at_once_and_refuses_the_next_reset() -> None:
    budget = ResetBudget(burst=5, rate=1.0)
    assert all(budget.spend(0.0) for _ in range(5))
    assert not budget.spend(0.0)
    assert budget.resets == 6


def test_the_budget_regains_its_rate_per_second_up_to_the_burst() -> None:
    budget = ResetBudget(burst=3, rate=2.0)
    assert all(budget.spend(10.0) for _ in range(3))
    assert not budget.spend(10.2)  # 0.4 of a reset regained
    assert budget.spend(10.5)  # a whole one by now
    assert not budget.spend(10.5)
    # A long quiet time refills to the burst, never beyond it.
    assert all(budget.spend(1000.0) for _ in range(3))
    assert not budget.spend(1000.0)


def test_a_clock_that_steps_back_regains_nothing() -> None:
    budget = ResetBudget(burst=1, rate=100.0)
    assert budget.spend(5.0)
    assert not budget.spend(4.0)
    assert not budget.spend(5.0)


def test_the_defaults_are_nghttp2s() -> None:
    budget = ResetBudget()
    assert (budget.burst, budget.rate) == (RESET_BURST, RESET_RATE) == (1000, 33.0)
    # A browser cancelling a page's hundred requests each second stays well within it.
    assert all(budget.spend(second + n / 100) for second in range(10) for n in range(100))


@pytest.mark.parametrize(("burst", "rate"), [(0, 1.0), (5, -1.0)])
def test_a_budget_that_allows_nothing_is_refused(burst: int, rate: float) -> None:
    with pytest.raises(ValueError, match="burst of at least 1"):
        ResetBudget(burst=burst, rate=rate)
