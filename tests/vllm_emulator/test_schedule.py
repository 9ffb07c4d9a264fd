"""The timing model on a virtual clock: exact token times for prefill, decode, batch
slowdown, queueing over max_num_seqs, KV-block gating, aborts, pauses and keep-alives."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from vllm_emulator.schedule import Admitted, KeepAlive, Pause, Scheduler, TimingModel, Token


def instant(**overrides: object) -> TimingModel:
    """No prefill, no jitter, no slowdown, 10 ms ITL, unless overridden."""
    base = TimingModel(
        prefill_overhead=0.0, prefill_per_token=0.0, itl=0.01, itl_jitter=0.0, batch_slowdown=0.0
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


EXACT = TimingModel(
    prefill_overhead=0.1,
    prefill_per_token=0.01,
    itl=0.02,
    itl_jitter=0.0,
    batch_slowdown=0.0,
    max_num_seqs=2,
    kv_block_size=16,
    kv_num_blocks=100,
)


def run(scheduler: Scheduler, until: float = 100.0) -> list[tuple[float, str, int | str]]:
    """Drain events up to `until`, as (time, seq, token index or 'admit')."""
    out: list[tuple[float, str, int | str]] = []
    while (deadline := scheduler.deadline()) is not None and deadline <= until:
        for event in scheduler.advance(deadline):
            if isinstance(event, Admitted):
                out.append((round(event.time, 9), event.seq_id, "admit"))
            else:
                out.append((round(event.time, 9), event.seq_id, event.index))
    return out


def test_one_sequence_gets_prefill_then_one_token_per_itl() -> None:
    scheduler = Scheduler(EXACT)
    scheduler.submit("a", 1.0, prompt_tokens=10, output_tokens=3, seed=0)
    assert run(scheduler) == [(1.0, "a", "admit"), (1.2, "a", 0), (1.22, "a", 1), (1.24, "a", 2)]
    assert scheduler.num_running == 0 and scheduler.kv_usage == 0.0


def test_the_last_token_is_flagged_and_frees_the_slot() -> None:
    scheduler = Scheduler(EXACT)
    scheduler.submit("a", 0.0, prompt_tokens=0, output_tokens=2, seed=0)
    events = scheduler.advance(10.0)
    assert [e.last for e in events if isinstance(e, Token)] == [False, True]


def test_requests_beyond_max_num_seqs_wait_until_a_slot_frees() -> None:
    scheduler = Scheduler(EXACT)
    for name in "abc":
        scheduler.submit(name, 0.0, prompt_tokens=0, output_tokens=2, seed=0)
    assert (scheduler.num_running, scheduler.num_waiting) == (2, 1)
    assert run(scheduler) == [
        (0.0, "a", "admit"),
        (0.0, "b", "admit"),
        (0.1, "a", 0),
        (0.1, "b", 0),
        (0.12, "a", 1),
        (0.12, "c", "admit"),
        (0.12, "b", 1),
        (0.22, "c", 0),
        (0.24, "c", 1),
    ]


def test_the_itl_grows_with_the_running_batch() -> None:
    scheduler = Scheduler(
        instant(
            itl=0.1,
            batch_slowdown=0.5,
            max_num_seqs=4,
        )
    )
    scheduler.submit("a", 0.0, prompt_tokens=0, output_tokens=2, seed=0)
    scheduler.submit("b", 0.0, prompt_tokens=0, output_tokens=3, seed=0)
    # Two running: load 1.5, so prefill 0 then gaps of 0.15; alone, b's gap is 0.1.
    assert run(scheduler) == [
        (0.0, "a", "admit"),
        (0.0, "b", "admit"),
        (0.0, "a", 0),
        (0.0, "b", 0),
        (0.15, "a", 1),
        (0.15, "b", 1),
        (0.25, "b", 2),
    ]


def test_kv_blocks_gate_admission_first_come_first_served() -> None:
    model = instant(
        itl=0.01,
        max_num_seqs=10,
        kv_block_size=16,
        kv_num_blocks=4,
    )
    scheduler = Scheduler(model)
    scheduler.submit("big", 0.0, prompt_tokens=40, output_tokens=8, seed=0)  # 3 blocks
    scheduler.submit("next", 0.0, prompt_tokens=20, output_tokens=1, seed=0)  # 2 blocks: waits
    scheduler.submit("small", 0.0, prompt_tokens=1, output_tokens=1, seed=0)  # fits, but FCFS
    assert (scheduler.num_running, scheduler.num_waiting) == (1, 2)
    assert scheduler.kv_usage == 0.75
    events = run(scheduler)
    assert (0.07, "next", "admit") in events and (0.07, "small", "admit") in events
    assert scheduler.kv_usage == 0.0


def test_a_sequence_larger_than_the_whole_cache_is_refused() -> None:
    scheduler = Scheduler(TimingModel(kv_block_size=16, kv_num_blocks=2))
    with pytest.raises(ValueError, match="needs 3 KV blocks"):
        scheduler.submit("x", 0.0, prompt_tokens=40, output_tokens=1, seed=0)


def test_an_abort_stops_tokens_frees_blocks_and_admits_the_next_at_once() -> None:
    scheduler = Scheduler(EXACT)
    for name in "abc":
        scheduler.submit(name, 0.0, prompt_tokens=0, output_tokens=100, seed=0)
    scheduler.advance(0.13)  # a and b have 0.1, 0.12
    assert scheduler.abort("a", 0.13) is True
    assert scheduler.abort("a", 0.13) is False
    events = run(scheduler, until=0.25)
    assert not [e for e in events if e[1] == "a"]
    assert events[0] == (0.13, "c", "admit")
    assert (0.23, "c", 0) in events


def test_aborting_a_waiting_sequence_removes_it_from_the_queue() -> None:
    scheduler = Scheduler(EXACT)
    for name in "abc":
        scheduler.submit(name, 0.0, prompt_tokens=0, output_tokens=5, seed=0)
    assert scheduler.abort("c", 0.05) is True
    assert scheduler.num_waiting == 0
    assert not [e for e in run(scheduler) if e[1] == "c"]


def test_a_pause_delays_the_token_after_the_given_count() -> None:
    model = instant(
        itl=0.01,
        pauses=(Pause(after_tokens=2, duration=5.0),),
    )
    scheduler = Scheduler(model)
    scheduler.submit("a", 0.0, prompt_tokens=0, output_tokens=4, seed=0)
    times = [t for t, _, what in run(scheduler) if what != "admit"]
    assert times == [0.0, 0.01, 5.02, 5.03]


def test_jitter_is_seeded_bounded_and_averages_the_itl() -> None:
    model = instant(itl=0.02, itl_jitter=0.3)

    def gaps(seed: int) -> list[float]:
        scheduler = Scheduler(model)
        scheduler.submit("a", 0.0, prompt_tokens=0, output_tokens=2001, seed=seed)
        times = [t for t, _, what in run(scheduler, until=1e9) if what != "admit"]
        return [b - a for a, b in itertools.pairwise(times)]

    first = gaps(1)
    assert first == gaps(1) and first != gaps(2)
    assert min(first) >= 0.3 * 0.02 - 1e-9 and max(first) <= 1.7 * 0.02 + 1e-9
    assert abs(sum(first) / len(first) - 0.02) < 0.001


def test_keep_alive_is_due_after_an_idle_interval_and_resets_on_each_write() -> None:
    keep = KeepAlive(interval=2.0, last_write=10.0)
    assert keep.deadline() == 12.0 and not keep.due(11.9) and keep.due(12.0)
    keep.wrote(12.5)
    assert keep.deadline() == 14.5
    assert KeepAlive(interval=0.0).deadline() is None
