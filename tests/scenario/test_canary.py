"""The canary's reading on the virtual clock: its hold shape replayed through a path of faults
(`faults.testing.replay`, as the fingerprint's own tests do), the leave measure from probe
records, and the three numbers read back. nginx-default's buffer must show as 4 KiB held and
a first token ~0.3 s late; a bare path must show neither. And the watch's state across
rounds: a failure counts and keeps the last numbers, a success clears the error."""

from __future__ import annotations

from faults.coalescer import Coalescer
from faults.proxy_buffering import ProxyBuffering
from middlebox.scenario import canary
from middlebox.scenario import fingerprint as fp
from middlebox.scenario.canary import CANARY_HOLD, Reading, Watch
from tests.scenario.test_fingerprint import record_of, through

LEARNED = fp.leave(
    record_of("HTTP/1.1", "chunked", client_left={"how": "fin", "at": 0.052, "frames_written": 3}),
    closed_at=0.05,
    waited=5.0,
)
NEVER = fp.leave(record_of("HTTP/1.1", "chunked"), closed_at=0.05, waited=5.0)


def test_a_bare_path_holds_nothing_and_adds_nothing_to_the_first_token() -> None:
    found = canary.reading(through(CANARY_HOLD, None), LEARNED)
    assert found.bytes_held == 0
    assert found.added_ttft == 0.0
    assert (found.cancel_seconds, found.cancel_learned) == (0.002, True)


def test_nginx_default_buffering_holds_its_4_kib_buffer_and_delays_the_first_token() -> None:
    # nginx-default's proxy_buffering (4 KiB, postpone_output 1460): the first release
    # comes when the buffer is full, about 15 frames of ~270 wire bytes at 20 ms
    found = canary.reading(through(CANARY_HOLD, ProxyBuffering()), LEARNED)
    assert found.bytes_held is not None
    assert abs(found.bytes_held - 4096) <= 270
    assert found.added_ttft is not None and 0.25 <= found.added_ttft <= 0.35


def test_a_larger_buffer_reads_as_more_bytes_held_and_a_later_first_token() -> None:
    small = canary.reading(through(CANARY_HOLD, ProxyBuffering()), None)
    large = canary.reading(
        through(CANARY_HOLD, ProxyBuffering(buffer_size=8192, buffers_size=8192)), None
    )
    assert large.bytes_held is not None and abs(large.bytes_held - 8192) <= 270
    assert small.added_ttft is not None and large.added_ttft is not None
    assert large.added_ttft > small.added_ttft + 0.1


def test_a_timer_hold_holds_bytes_too() -> None:
    found = canary.reading(through(CANARY_HOLD, Coalescer(window=0.3, size=1_000_000)), None)
    assert found.bytes_held is not None and found.bytes_held > 1024
    assert found.added_ttft is not None and found.added_ttft >= 0.2


def test_a_stream_that_did_not_arrive_whole_holds_an_unknown_number_of_bytes() -> None:
    hold = {"release": "incomplete", "bursts": [], "first_frame_wait": None}
    found = canary.reading(hold, None)
    assert (found.bytes_held, found.added_ttft, found.cancel_seconds) == (None, None, None)
    assert found.line() == "added TTFT ?, held ?, cancel ?"


def test_a_leave_never_learned_reads_as_at_least_the_wait() -> None:
    found = canary.reading(through(CANARY_HOLD, None), NEVER)
    assert (found.cancel_seconds, found.cancel_learned) == (5.0, False)
    assert found.line().endswith("cancel not learned in 5.0 s")


def test_a_learned_leave_prints_its_time_and_not_the_wait() -> None:
    line = canary.reading(through(CANARY_HOLD, None), LEARNED).line()
    assert line == "added TTFT 0.000 s, held 0 B, cancel 0.002 s"
    assert "not learned" not in line


def test_a_failed_round_counts_and_keeps_the_last_numbers_until_a_success() -> None:
    watch = Watch()
    assert (watch.up, watch.last, watch.last_success) == (False, None, None)
    first = Reading(0.0, 0, 0.001, True)
    watch.succeeded(first, at=1000.0, took=1.2)
    watch.failed("cannot connect", took=0.1)
    assert (watch.rounds, watch.failures, watch.up) == (2, 1, False)
    assert (watch.last, watch.last_success, watch.error) == (first, 1000.0, "cannot connect")
    second = Reading(0.3, 4096, 0.001, True)
    watch.succeeded(second, at=1010.0, took=1.3)
    assert (watch.rounds, watch.failures, watch.up, watch.error) == (3, 1, True, None)
    assert (watch.last, watch.last_success, watch.last_round_seconds) == (second, 1010.0, 1.3)
