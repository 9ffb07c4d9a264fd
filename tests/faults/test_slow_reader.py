"""slow_reader: a trickling client or a paused upstream reader, with small buffers."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.slow_reader import SlowReader
from faults.testing import TimedItem, bind_for_test, replay
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.netprops import assert_deterministic, assert_preserved, timelines


def test_a_slow_client_drains_the_response_at_its_rate_in_small_reads() -> None:
    out = replay(
        SlowReader(rate=1024, segment=256),
        [(0.0, Chunk(DOWN, b"r" * 600)), (0.0, Chunk(UP, b"GET")), (0.125, Eof(DOWN))],
    )
    assert out == [
        (0.0, Chunk(UP, b"GET")),
        (0.25, Chunk(DOWN, b"r" * 256)),
        (0.5, Chunk(DOWN, b"r" * 256)),
        (0.5859375, Chunk(DOWN, b"r" * 88)),
        (0.5859375, Eof(DOWN)),
    ]


def test_an_upstream_reader_stops_reading_for_the_pause_then_passes_what_it_had() -> None:
    fault = SlowReader(side="upstream", pause=2.0, rate=0, start=1.0)
    out = replay(
        fault, [(0.5, Chunk(DOWN, b"a")), (1.5, Chunk(DOWN, b"b")), (2.0, Chunk(UP, b"q"))]
    )
    assert out == [(0.5, Chunk(DOWN, b"a")), (2.0, Chunk(UP, b"q")), (3.0, Chunk(DOWN, b"b"))]
    assert [(r.time, r.action) for r in fault.reports] == [
        (0.0, "slow_reader"),
        (1.0, "pause"),
        (3.0, "pause_over"),
    ]


def test_reading_from_the_upstream_is_paused_exactly_during_the_pause() -> None:
    fault = bind_for_test(SlowReader(side="upstream", pause=2.0, start=1.0))
    fault.on_open(0.0)
    assert not fault.reading_paused(DOWN)
    assert fault.deadline() == 1.0
    fault.on_deadline(1.0)
    assert fault.reading_paused(DOWN)
    assert not fault.reading_paused(UP)
    assert fault.deadline() == 3.0
    fault.on_deadline(3.0)
    assert not fault.reading_paused(DOWN)


def test_a_backlog_over_its_bound_stops_reading_the_upstream_until_it_drains() -> None:
    fault = bind_for_test(SlowReader(rate=1024, segment=256, max_backlog=512))
    fault.on_open(0.0)
    fault.on_item(Chunk(DOWN, b"x" * 1024), 0.0)
    assert fault.reading_paused(DOWN)
    assert fault.on_deadline(0.25) == [Chunk(DOWN, b"x" * 256)]
    assert fault.reading_paused(DOWN)
    assert fault.on_deadline(0.5) == [Chunk(DOWN, b"x" * 256)]
    assert not fault.reading_paused(DOWN)


@pytest.mark.parametrize(
    ("side", "buffers"),
    [("client", {"client_sndbuf": 2048}), ("upstream", {"upstream_rcvbuf": 2048})],
)
def test_the_small_socket_buffer_is_set_on_the_slow_side(
    side: Any, buffers: dict[str, int]
) -> None:
    assert SlowReader(side=side, buffer=2048).socket_buffers() == buffers


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"side": "server"}, "side must be one of"),
        ({"rate": -1}, "rate"),
        ({"segment": 0}, "segment"),
        ({"buffer": 0}, "buffer"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlowReader(**config)


@given(timelines(), st.sampled_from(["client", "upstream"]), st.integers(1, 2048), st.floats(0, 1))
def test_bytes_and_order_are_preserved_and_the_reader_never_outpaces_its_rate(
    timeline: list[TimedItem], side: Any, rate: int, pause: float
) -> None:
    out = replay(SlowReader(side=side, rate=rate, pause=pause, segment=64), timeline)
    assert_preserved(timeline, out)
    first_in = min((t for t, item in timeline if item.direction is DOWN), default=0.0)
    read = 0
    for t, item in out:
        if isinstance(item, Chunk) and item.direction is DOWN:
            read += len(item.data)
            assert read <= rate * (t - max(first_in, pause)) * (1 + 1e-9) + 1e-6


@settings(max_examples=30)
@given(timelines(), st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_reads(timeline: list[TimedItem], seed: int) -> None:
    assert_deterministic(lambda: SlowReader(rate=100, pause=0.5, segment=8), timeline, seed)
