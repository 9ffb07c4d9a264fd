"""link: named access networks; a lost segment stalls one RTO and blocks what follows."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.link import PROFILES, TCP_RTO_MIN, Link, Profile, ProfileName
from faults.testing import TimedItem, replay
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.netprops import assert_deterministic, assert_preserved, bind_scripted, timelines


def test_loopback_changes_nothing() -> None:
    timeline: list[TimedItem] = [
        (0.0, Chunk(UP, b"GET")),
        (0.5, Chunk(DOWN, b"ok")),
        (1.0, Eof(DOWN)),
    ]
    assert replay(Link(profile="loopback"), timeline) == timeline


def test_each_direction_takes_half_the_round_trip() -> None:
    out = replay(
        Link(profile="loopback", rtt=0.5), [(0.0, Chunk(UP, b"a")), (0.25, Chunk(DOWN, b"b"))]
    )
    assert out == [(0.25, Chunk(UP, b"a")), (0.5, Chunk(DOWN, b"b"))]


def test_a_lost_segment_arrives_one_rto_late_and_holds_back_the_ones_behind_it() -> None:
    fault = bind_scripted(Link(profile="loopback", rtt=0.25, loss=0.5, rto=1.0), [0.9, 0.1, 0.9])
    out = replay(
        fault,
        [(0.0, Chunk(DOWN, b"one")), (0.125, Chunk(DOWN, b"two")), (0.25, Chunk(DOWN, b"three"))],
        bind=False,
    )
    assert out == [
        (0.125, Chunk(DOWN, b"one")),
        (1.25, Chunk(DOWN, b"two")),
        (1.25, Chunk(DOWN, b"three")),
    ]
    assert [(r.time, r.action, r.details) for r in fault.reports[1:]] == [
        (0.125, "loss", {"direction": "downstream", "offset": 3, "stall": 1.0})
    ]


def test_the_rto_follows_rfc_6298_with_linux_200ms_floor() -> None:
    assert Link(profile="loopback", rtt=0.5, jitter=0.125).effective.rto == 1.0
    assert PROFILES["wifi"].rto == TCP_RTO_MIN
    out = replay(
        bind_scripted(Link(profile="loopback", rtt=0.0625, loss=0.5), [0.0]),
        [(0.0, Chunk(DOWN, b"x"))],
        bind=False,
    )
    assert [item for _, item in out] == [Chunk(DOWN, b"x")]
    assert out[0][0] == pytest.approx(0.03125 + 0.2)


def test_each_direction_has_its_own_rate_clocking_out_mss_segments() -> None:
    out = replay(
        Link(profile="loopback", downstream_rate=1024, segment=512),
        [(0.0, Chunk(DOWN, b"d" * 1024)), (0.0, Chunk(UP, b"u" * 1024))],
    )
    assert out == [
        (0.0, Chunk(UP, b"u" * 512)),
        (0.0, Chunk(UP, b"u" * 512)),
        (0.5, Chunk(DOWN, b"d" * 512)),
        (1.0, Chunk(DOWN, b"d" * 512)),
    ]


def test_a_field_overrides_its_number_and_keeps_the_rest_of_the_profile() -> None:
    lte = PROFILES["lte"]
    assert Link(profile="lte", rtt=0.1).effective == Profile(
        0.1, lte.jitter, lte.downstream_rate, lte.upstream_rate, lte.loss
    )


def test_every_named_profile_exists_and_slower_networks_have_longer_round_trips() -> None:
    assert set(PROFILES) == set(get_args(ProfileName))
    rtts = [PROFILES[name].rtt for name in ("loopback", "wifi", "lte", "3g", "satellite", "edge")]
    assert rtts == sorted(rtts)
    assert (
        PROFILES["edge"].downstream_rate
        < PROFILES["3g"].downstream_rate
        < PROFILES["lte"].downstream_rate
    )


def test_opening_reports_the_numbers_in_force() -> None:
    fault = Link(profile="3g")
    replay(fault, [])
    assert fault.reports[0].action == "link"
    assert fault.reports[0].details["rtt"] == 0.3
    assert fault.reports[0].details["rto"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"profile": "5g"}, "profile must be one of"),
        ({"loss": 1.5}, "loss"),
        ({"rtt": -0.1}, "rtt must be >= 0"),
        ({"rto": 0.0}, "rto must be > 0"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Link(**config)  # type: ignore[arg-type]


@given(timelines(), st.sampled_from(sorted(PROFILES)), st.integers(0, 2**32))
def test_bytes_ends_and_order_are_preserved_on_every_profile(
    timeline: list[TimedItem], profile: ProfileName, seed: int
) -> None:
    out = replay(Link(profile=profile, loss=0.3), timeline, seed=seed)
    assert_preserved(timeline, out)


@settings(max_examples=30)
@given(timelines(), st.integers(0, 2**32))
def test_the_same_seed_loses_the_same_segments(timeline: list[TimedItem], seed: int) -> None:
    assert_deterministic(lambda: Link(profile="3g", loss=0.3), timeline, seed)
