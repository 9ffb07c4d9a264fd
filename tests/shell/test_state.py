"""Scenario state shared by workers and proxies: the stores behind `FaultContext.shared`.

The memory store is checked across real forks (two processes counting at once lose no
increment); the Redis store against a redis-server from Debian's package started on a free
loopback port (skipped when it is not installed, never under CI=true).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.scenario_state import SharedStore, for_fault, increment
from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, state_scope
from middlebox.shell.state import (
    HostClock,
    MemoryBackend,
    RedisBackend,
    ScopedStore,
    open_backend,
    scoped,
)
from tests.shell.redis_server import RedisServer, redis_server_or_skip


@pytest.fixture
def memory() -> Any:
    backend = MemoryBackend(size=64 * 1024)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def redis_url() -> Any:
    server: RedisServer = redis_server_or_skip()
    try:
        yield server.url
    finally:
        server.stop()


def test_a_plain_dict_counts_in_place_as_the_one_process_proxy_always_did() -> None:
    shared: dict[str, Any] = {}
    assert [increment(shared, "seen") for _ in range(3)] == [1, 2, 3]
    assert increment(shared, "seen", by=10) == 13
    assert shared == {"seen": 13}


def test_a_scoped_store_is_a_mapping_of_its_own_scope_only(memory: MemoryBackend) -> None:
    first, second = ScopedStore(memory, "s/0.a"), ScopedStore(memory, "s/1.a")
    first["outage"] = {"start": 1.5, "end": 3.0, "outcome": "reset"}
    assert increment(first, "count") == 1 and increment(first, "count") == 2
    assert first["outage"] == {"start": 1.5, "end": 3.0, "outcome": "reset"}
    assert sorted(first) == ["count", "outage"] and len(first) == 2
    assert second.get("count") is None and len(second) == 0 and "count" not in second
    with pytest.raises(KeyError):
        second["count"]
    del first["outage"]
    assert dict(first) == {"count": 2}
    with pytest.raises(KeyError):
        del first["outage"]


def test_setdefault_keeps_the_first_value_stored(memory: MemoryBackend) -> None:
    store = ScopedStore(memory, "s/0.match")
    assert store.setdefault("epoch", 5.0) == 5.0
    assert store.setdefault("epoch", 9.0) == 5.0
    assert store["epoch"] == 5.0


def test_two_forked_processes_counting_at_once_lose_no_increment(
    memory: MemoryBackend,
) -> None:
    store = ScopedStore(memory, "s/0.http_error")
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's coverage is not collected)
        code = 0
        try:
            seen = [increment(store, "count") for _ in range(500)]
            code = 0 if seen == sorted(set(seen)) else 1
        finally:
            os._exit(code)
    mine = [increment(store, "count") for _ in range(500)]
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store["count"] == 1000
    assert len(set(mine)) == 500  # every index handed out once


def test_a_full_memory_block_says_so_instead_of_writing_past_it() -> None:
    backend = MemoryBackend(size=64)
    try:
        with pytest.raises(OverflowError, match="scenario state is"):
            ScopedStore(backend, "s")["big"] = "x" * 100
    finally:
        backend.close()


def test_a_fault_changing_values_in_place_keeps_a_dict_of_its_process(
    memory: MemoryBackend,
) -> None:
    class Queueing(Fault):
        name = "queueing"
        shared_in_process = True

    store = ScopedStore(memory, "s/0.queueing")
    assert for_fault(store, in_process=True) is store.process_local
    assert for_fault(store, in_process=False) is store
    plain: dict[str, Any] = {}
    assert for_fault(plain, in_process=True) is plain
    pipeline = Pipeline([Queueing(), Fault()])
    pipeline.bind(FaultContext(1, random.Random(1)), [store, store])
    assert pipeline.faults[0].context.shared is store.process_local
    assert pipeline.faults[1].context.shared is store


def test_a_store_names_each_position_by_scenario_index_fault_and_options() -> None:
    one = state_scope("storm", 0, "http_error", {"status": 429, "match": {"first": 3}})
    same = state_scope("storm", 0, "http_error", {"match": {"first": 3}, "status": 429})
    changed = state_scope("storm", 0, "http_error", {"status": 429, "match": {"first": 4}})
    assert one == same and one.startswith("storm/0.http_error.")
    assert changed != one
    assert state_scope("storm", 1, "http_error", {}) != state_scope("storm", 0, "http_error", {})


def test_the_server_gives_each_position_a_store_when_one_is_configured(
    memory: MemoryBackend,
) -> None:
    scenario = Scenario(name="plain")
    alone = ProxyServer(ProxyConfig(Address("127.0.0.1", 1), scenario))
    assert alone.shared == [] and alone.new_shared(scenario) == []
    stored = ProxyServer(
        ProxyConfig(Address("127.0.0.1", 1), scenario, shared_state=scoped(memory))
    )
    stage = stored._stage_state("request_timeouts")
    assert isinstance(stage, SharedStore) and stage is stored._stage_state("request_timeouts")
    assert repr(stage) == "ScopedStore('proxy/request_timeouts/')"


def test_the_host_clock_is_the_monotonic_clock_every_process_reads() -> None:
    clock = HostClock()
    clock.start_clock()
    now = clock.current_time()
    assert abs(clock.deadline_to_sleep_time(now + 10.0) - 10.0) < 1.0
    assert clock.deadline_to_sleep_time(now - 1.0) < 0


def test_a_state_url_that_is_not_redis_is_refused() -> None:
    with pytest.raises(ValueError, match="redis://HOST:PORT/DB"):
        open_backend("memcached://127.0.0.1:11211")


def test_redis_counts_with_incr_and_keeps_first_values(redis_url: str) -> None:
    backend = open_backend(redis_url + "/0")
    other = RedisBackend(redis_url + "/0")  # a second proxy's connection
    try:
        mine, theirs = ScopedStore(backend, "r/0.http_error"), ScopedStore(other, "r/0.http_error")
        assert increment(mine, "count") == 1
        assert increment(theirs, "count") == 2
        assert mine["count"] == 2  # INCR's string reads back as the integer
        assert mine.setdefault("epoch", 1.25) == 1.25
        assert theirs.setdefault("epoch", 7.0) == 1.25
        theirs["outage"] = {"start": 1.0, "end": 3.0, "outcome": "resume"}
        assert mine["outage"] == {"start": 1.0, "end": 3.0, "outcome": "resume"}
        assert sorted(mine) == ["count", "epoch", "outage"]
        del mine["outage"]
        assert "outage" not in theirs and len(theirs) == 2
        # A scope with glob characters matches only itself.
        odd = ScopedStore(backend, "r/[0]*")
        odd["x"] = 1
        assert list(odd) == ["x"] and "x" not in ScopedStore(backend, "r/0")
    finally:
        backend.close()
        other.close()


def test_redis_that_is_not_there_fails_at_start() -> None:
    with pytest.raises(OSError):
        open_backend("redis://127.0.0.1:1/0")


def test_new_state_for_one_edited_position_is_scoped_to_that_position(
    memory: MemoryBackend,
) -> None:
    from faults.http_error import HttpError
    from middlebox.scenario.model import FaultSpec

    path = (FaultSpec(HttpError, {"status": 429}), FaultSpec(HttpError, {"status": 503}))
    scenario = Scenario(name="edited", path=path)
    server = ProxyServer(
        ProxyConfig(Address("127.0.0.1", 1), scenario, shared_state=scoped(memory))
    )
    assert [repr(state)[:28] for state in server.shared] == [
        "ScopedStore('edited/0.http_e",
        "ScopedStore('edited/1.http_e",
    ]
    (only,) = server.new_shared(scenario, only=1)
    first, second = server.shared
    assert isinstance(only, ScopedStore) and isinstance(second, ScopedStore)
    assert only.prefix == second.prefix
    # Another proxy running the same scenario names the same keys.
    assert isinstance(first, ScopedStore)
    increment(first, "match.count")
    assert increment(ScopedStore(memory, first.prefix[:-1]), "match.count") == 2
