"""faults._http: parsing what matching needs, choosing requests across connections, and
deciding each request exactly once whatever the chunking."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults._lib.match import HttpMatched, RequestInfo, RequestMatch, request_info, request_path
from middlebox.core.fault import Fault, FaultContext
from middlebox.core.http1 import Head
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item
from middlebox.scenario.load import load_scenario_text


def post(path: str = "/v1/chat/completions", body: bytes = b'{"model":"qwen-7b"}') -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
    )


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Probe(HttpMatched, Fault):
    """A fault that only records decisions, to drive the mixin."""

    name: ClassVar[str] = "probe"

    def on_item(self, item: Item, now: float) -> list[Item]:
        self.observe(item, now)
        return [item]


def bound(fault: Probe, shared: dict[str, Any], seed: int = 0, now: float = 0.0) -> Probe:
    fault.bind(FaultContext(rng=random.Random(seed), shared=shared))
    fault.on_open(now)
    return fault


def head(target: str, method: str = "POST") -> Head:
    return Head(version="HTTP/1.1", method=method, target=target)


# -- parsing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/models?limit=3", "/v1/models"),
        ("http://api.example:8000/v1/completions?x=1", "/v1/completions"),
        ("http://api.example", "/"),
        ("*", "*"),
    ],
)
def test_the_path_drops_the_query_and_the_authority_of_an_absolute_target(
    target: str, path: str
) -> None:
    assert request_path(target) == path


def test_the_model_is_read_from_a_complete_json_body_only() -> None:
    body = b'{"model": "Qwen/Qwen3-0.6B", "stream": true}'
    assert request_info(0, head("/v1/chat/completions"), body, True).model == "Qwen/Qwen3-0.6B"
    assert request_info(0, head("/v1/chat/completions"), body[:20], False).model is None
    assert request_info(0, head("/x"), b"not json", True).model is None
    assert request_info(0, head("/x"), b'{"model": 7}', True).model is None
    assert request_info(0, head("/x"), b"[1, 2]", True).model is None


# -- choosing ------------------------------------------------------------------------


def info(method: str = "POST", path: str = "/v1/chat/completions", model: str = "m") -> RequestInfo:
    return request_info(0, head(path, method), b'{"model":"%s"}' % model.encode(), True)


def test_method_path_and_model_filters_must_all_hold() -> None:
    match = RequestMatch(method="post", path="/v1/*", model="qwen-*")
    assert match.accepts(info(model="qwen-7b"))
    assert not match.accepts(info(method="GET", model="qwen-7b"))
    assert not match.accepts(info(path="/health", model="qwen-7b"))
    assert not match.accepts(info(model="llama"))
    assert RequestMatch().accepts(info(method="GET", path="/metrics"))


@pytest.mark.parametrize(
    ("config", "chosen"),
    [
        ({}, [0, 1, 2, 3, 4, 5, 6, 7, 8]),
        ({"requests": [0, 2]}, [0, 2]),
        ({"first": 3}, [0, 1, 2]),
        ({"every": 3}, [2, 5, 8]),
        ({"every": 2, "first": 5}, [1, 3]),
        ({"requests": [1, 4, 7], "every": 2}, [1, 7]),
    ],
)
def test_indices_are_chosen_by_list_first_n_and_every_nth(
    config: dict[str, Any], chosen: list[int]
) -> None:
    match = RequestMatch(**config)
    rng = random.Random(0)
    assert [i for i in range(9) if match.chooses(i, rng)] == chosen


def test_the_index_counts_only_requests_that_pass_the_filters_across_connections() -> None:
    shared: dict[str, Any] = {}
    match = RequestMatch(path="/v1/chat/completions", requests=[1])
    first = bound(Probe(match=match), shared)
    second = bound(Probe(match=match), shared)
    first.on_item(Chunk(UP, post(path="/health")), 0.1)
    first.on_item(Chunk(UP, post()), 0.2)
    second.on_item(Chunk(UP, post(path="/health")), 0.3)
    second.on_item(Chunk(UP, post()), 0.4)
    first.on_item(Chunk(UP, post()), 0.5)
    assert [first.selected(m) for m in range(3)] == [None, None, None]
    assert [second.selected(m) for m in range(2)] == [None, 1]
    # No window: no epoch is stored (a store round trip per connection with redis://)
    assert shared == {"probe.match.count": 3}


def test_windowed_matches_on_two_connections_share_the_first_connections_epoch() -> None:
    shared: dict[str, Any] = {}
    match = RequestMatch(after=1.0)
    first = bound(Probe(match=match), shared, now=4.0)
    second = bound(Probe(match=match), shared, now=4.5)
    second.on_item(Chunk(UP, post()), 4.8)  # 0.8 s after the first connection: too early
    first.on_item(Chunk(UP, post()), 5.2)
    assert shared["probe.match.epoch"] == 4.0
    assert [second.selected(0), first.selected(0)] == [None, 0]


class CountingStore(dict[str, Any]):
    """A dict that counts `setdefault` calls: each is a round trip on a shared store."""

    setdefaults = 0

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.setdefaults += 1
        return super().setdefault(key, default)


def test_a_connection_reads_its_windows_epoch_once_and_an_unwindowed_match_never() -> None:
    windowed, plain = CountingStore(), CountingStore()
    for shared, match in ((windowed, RequestMatch(before=10.0)), (plain, RequestMatch())):
        fault = bound(Probe(match=match), shared)
        for index in range(5):
            fault.on_item(Chunk(UP, post()), 0.5 + index)
        assert [fault.selected(m) for m in range(5)] == [0, 1, 2, 3, 4]
    assert (windowed.setdefaults, plain.setdefaults) == (1, 0)


def test_the_window_counts_from_the_first_connection_of_the_scenario() -> None:
    shared: dict[str, Any] = {}
    match = RequestMatch(after=2.0, before=10.0)
    early = bound(Probe(match=match), shared, now=5.0)
    late = bound(Probe(match=match), shared, now=8.0)
    early.on_item(Chunk(UP, post()), 6.5)
    early.on_item(Chunk(UP, post()), 7.0)
    late.on_item(Chunk(UP, post()), 12.0)
    late.on_item(Chunk(UP, post()), 15.0)
    assert [early.selected(0), early.selected(1)] == [None, 0]
    assert [late.selected(0), late.selected(1)] == [1, None]


def test_a_model_filter_waits_for_the_whole_body_and_other_filters_only_for_the_head() -> None:
    shared: dict[str, Any] = {}
    by_model = bound(Probe(match=RequestMatch(model="qwen-*")), shared)
    by_path = bound(Probe(match=RequestMatch(path="/v1/*")), {})
    request = post()
    split = request.index(b"\r\n\r\n") + 4
    for fault in (by_model, by_path):
        fault.on_item(Chunk(UP, request[:split]), 1.0)
    assert (by_model.decided(0), by_path.decided(0)) == (False, True)
    by_model.on_item(Chunk(UP, request[split:]), 2.0)
    assert by_model.selected(0) == 0


def test_expect_100_continue_is_decided_at_the_head_so_nobody_waits_for_the_other() -> None:
    fault = bound(Probe(match=RequestMatch(model="qwen-*")), {})
    fault.on_item(
        Chunk(
            UP,
            b"POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 19\r\n\r\n",
        ),
        1.0,
    )
    assert fault.decided(0) and fault.selected(0) is None  # model unknown: not matched


def test_a_response_starting_decides_a_request_whose_body_is_still_incomplete() -> None:
    fault = bound(Probe(match=RequestMatch(model="*")), {})
    request = post()
    fault.on_item(Chunk(UP, request[:-3]), 1.0)
    assert not fault.decided(0)
    fault.on_item(Chunk(DOWN, OK), 1.5)
    assert fault.decided(0) and fault.selected(0) is None  # the model is not known yet


def test_the_clients_fin_decides_a_half_sent_request() -> None:
    fault = bound(Probe(match=RequestMatch(model="*")), {})
    fault.on_item(Chunk(UP, post()[:-3]), 1.0)
    fault.on_item(Eof(UP), 2.0)
    assert fault.decided(0) and fault.selected(0) is None


def test_probability_is_a_seeded_coin_so_the_same_seed_chooses_the_same_requests() -> None:
    def chosen(seed: int) -> list[int | None]:
        fault = bound(Probe(match=RequestMatch(probability=0.5)), {}, seed=seed)
        for _ in range(40):
            fault.on_item(Chunk(UP, post()), 1.0)
        return [fault.selected(m) for m in range(40)]

    assert chosen(7) == chosen(7)
    assert chosen(7) != chosen(8)
    assert 5 < sum(d is not None for d in chosen(7)) < 35


@given(
    cuts=st.lists(st.integers(0, 3 * len(post())), max_size=6),
    config=st.fixed_dictionaries(
        {"every": st.none() | st.integers(1, 3), "probability": st.sampled_from([0.3, 1.0])}
    ),
)
def test_decisions_do_not_depend_on_how_the_bytes_are_split(
    cuts: list[int], config: dict[str, Any]
) -> None:
    stream = post() + post(body=b'{"model":"b"}') + post(path="/v1/completions")
    bounds = sorted({0, len(stream), *(min(c, len(stream)) for c in cuts)})
    whole = bound(Probe(match=RequestMatch(**config)), {}, seed=3)
    whole.on_item(Chunk(UP, stream), 1.0)
    split = bound(Probe(match=RequestMatch(**config)), {}, seed=3)
    for lo, hi in itertools.pairwise(bounds):
        split.on_item(Chunk(UP, stream[lo:hi]), 1.0)
    assert [split.selected(m) for m in range(3)] == [whole.selected(m) for m in range(3)]
    assert all(split.decided(m) for m in range(3))


# -- config --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"method": "PO ST"}, "match.method"),
        ({"path": "v1/chat"}, "match.path must start with /"),
        ({"requests": [0, -1]}, "match.requests"),
        ({"first": -1}, "match.first"),
        ({"every": 0}, "match.every"),
        ({"probability": 1.5}, "match.probability"),
        ({"after": 5.0, "before": 5.0}, "match.before"),
    ],
)
def test_bad_match_config_is_refused_with_a_clear_message(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RequestMatch(**config)


def test_the_match_block_loads_from_yaml_with_units_and_lists() -> None:
    scenario = load_scenario_text(
        "name: m\npath:\n  - probe:\n      match: {method: POST, path: /v1/chat/completions,"
        ' model: "qwen-*", requests: [0, 2], every: 3, probability: 0.5, after: 2s,'
        " before: 10s}\n",
        {"probe": Probe},
    )
    (fault,) = scenario.build_faults()
    assert isinstance(fault, Probe)
    assert fault.match == RequestMatch(
        method="POST",
        path="/v1/chat/completions",
        model="qwen-*",
        requests=[0, 2],
        every=3,
        probability=0.5,
        after=2.0,
        before=10.0,
    )


def test_the_gate_holds_a_request_until_it_is_decided_then_releases_it_in_order() -> None:
    fault = bound(Probe(match=RequestMatch(model="*")), {})
    request = post() + post(path="/v1/completions")
    split = request.index(b"\r\n\r\n") + 4
    held = fault.gate(fault.observe(Chunk(UP, request[:split]), 1.0))
    released = fault.gate(fault.observe(Chunk(UP, request[split:]), 2.0))
    assert held == []
    assert b"".join(p.data for p in released) == request
    assert [fault.selected(m) for m in range(2)] == [0, 1]
