"""What the console's page costs: the work skipped when nothing changed or nothing needs it
(counted calls, not timings) and the feed slowing when its work would pass its CPU share (a
fake CPU clock on a virtual clock)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import h11
import pytest
import trio
import trio.testing

from middlebox.compose import PROXY_STAGES
from middlebox.console import classify as classify_module
from middlebox.console import model as model_module
from middlebox.console.classify import Side, StreamFacts, classify
from middlebox.console.model import ConsoleModel
from middlebox.console.server import FEED_IDLE, FEED_INTERVAL, Console
from middlebox.core.stream import Direction
from middlebox.observe.journal import ConnectionJournal
from middlebox.observe.requests import arrivals
from middlebox.run.serve import LIBRARY_SCENARIOS
from middlebox.shell.control import ControlledProxy, pass_through
from middlebox.shell.server import Address, ProxyConfig
from tests.console.test_classify import EVENT, HEAD, chunk, requested, tracked
from tests.console.test_console_server import feed_updates


def a_proxy() -> ControlledProxy:
    return ControlledProxy(
        ProxyConfig(Address("127.0.0.1", 9), pass_through(), stages=PROXY_STAGES),
        loader=LIBRARY_SCENARIOS,
    )


def two_streams(model: ConsoleModel) -> list[ConnectionJournal]:
    """Connection 1 streamed a token and ended both ways; connection 2 is still open."""
    journals = [tracked(model, cid, 0.0) for cid in (1, 2)]
    for journal in journals:
        requested(journal, 0.0)
        journal.read("upstream", Direction.DOWNSTREAM, HEAD + chunk(EVENT), 0.1)
        journal.wrote("client", Direction.DOWNSTREAM, HEAD + chunk(EVENT), 0.1)
    journals[0].ended("client", Direction.DOWNSTREAM, "sent_rst", 0.2)
    journals[0].ended("upstream", Direction.UPSTREAM, "sent_fin", 0.2)
    model.refresh()
    return journals


def test_a_closed_connection_is_summarised_once_while_nothing_moves() -> None:
    model = ConsoleModel()
    journals = two_streams(model)
    closed, live = model.connections[1], model.connections[2]
    first = {c["id"]: c for c in model.listing(0.3)["connections"]}
    assert first[1]["state"] == "cut" and first[2]["state"] == "open"
    assert (closed.summaries, live.summaries) == (1, 1)
    # the open one moves; later listings re-summarise it, never the closed one
    journals[1].read("upstream", Direction.DOWNSTREAM, chunk(EVENT), 0.4)
    model.refresh()
    later = {c["id"]: c for c in model.listing(5.0)["connections"]}
    assert (closed.summaries, live.summaries) == (1, 2)
    assert later[1] == first[1]
    assert "stall" in later[2]["kinds"]  # an open one's findings still follow the clock
    model.listing(6.0)
    assert (closed.summaries, live.summaries) == (1, 3)


def test_an_open_connection_is_summarised_again_as_time_passes() -> None:
    model = ConsoleModel()
    two_streams(model)
    live = model.connections[2]
    assert model.listing(0.3)["connections"][0]["kinds"] == []
    assert model.listing(3.0)["connections"][0]["kinds"] == ["stall"]
    assert live.summaries == 2


def test_the_list_and_a_detail_are_built_once_while_the_model_has_not_moved() -> None:
    now = [0.3]
    console = Console(a_proxy(), clock=lambda: now[0], cpu_clock=lambda: 0.0)
    journals = two_streams(console.model)
    first = console.listing()
    assert console.listing() == first and console.listings == 1
    detail = console.detail(2)
    assert detail is not None and console.detail(2) == detail and console.details == 1
    assert console.detail(3) is None  # not held
    journals[1].read("upstream", Direction.DOWNSTREAM, chunk(EVENT), 0.35)
    console.model.refresh()
    now[0] = 0.36
    assert console.listing() != first and console.listings == 2
    moved = console.detail(2)
    assert moved is not None and moved != detail and console.details == 2
    now[0] = 0.37 + FEED_INTERVAL  # the same model, but the page's next update is due
    again = console.detail(2)
    assert again is not None and b'"age":0.47' in again and console.details == 3


@pytest.mark.parametrize(
    ("cost", "interval"),
    [(0.0, FEED_INTERVAL), (0.002, 0.4), (0.05, FEED_IDLE)],
)
async def test_the_feed_slows_when_its_work_would_pass_its_cpu_share(
    mock_clock: trio.testing.MockClock, cost: float, interval: float
) -> None:
    mock_clock.autojump_threshold = 0
    spent = [0.0]

    def cpu() -> float:  # each list costs `cost` CPU seconds
        spent[0] += cost
        return spent[0]

    console = Console(a_proxy(), cpu_clock=cpu)
    updates = await feed_updates(console, 4.0)
    assert console.interval == pytest.approx(interval)
    assert json.loads(console.listing())["feed_interval"] == pytest.approx(interval)
    assert 4.0 / interval - 1 <= updates <= 4.0 / interval + 1


def test_bursts_counted_as_tokens_come_match_the_scorer_s_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(model_module, "MAX_TIMES", 50)
    side = model_module._SideState()
    at = 0.0
    for i in range(180):  # lumps of 1 to 4 tokens 1 ms apart, 60 ms between lumps
        at += 0.001 if i % (1 + i % 4) else 0.06
        side.token(at)
        assert side.bursts == len(arrivals(side.tokens))
    assert side.token_count == 180 and len(side.tokens) <= 50
    side.token(at - 1.0)  # out of order: counted afresh from the times, as arrivals sorts
    assert side.bursts is None
    facts = StreamFacts(0.0, client=Side(tokens=tuple(side.tokens), bursts=side.bursts))
    assert classify(facts, at) == classify(
        StreamFacts(0.0, client=Side(tokens=tuple(side.tokens))), at
    )


def test_a_smooth_stream_is_listed_without_walking_its_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = ConsoleModel()
    journal = tracked(model, 1, 0.0)
    requested(journal, 0.0)
    journal.read("upstream", Direction.DOWNSTREAM, HEAD, 0.05)
    journal.wrote("client", Direction.DOWNSTREAM, HEAD, 0.05)
    for i in range(40):
        journal.read("upstream", Direction.DOWNSTREAM, chunk(EVENT), 0.1 + 0.05 * i)
        journal.wrote("client", Direction.DOWNSTREAM, chunk(EVENT), 0.1 + 0.05 * i)
    model.refresh()
    walked: list[int] = []

    def counted(times: Iterable[float]) -> list[float]:
        found = arrivals(times)
        walked.append(len(found))
        return found

    monkeypatch.setattr(classify_module, "arrivals", counted)
    listed = model.listing(2.1)["connections"][0]
    assert listed["tokens"] == {"upstream": 40, "client": 40} and listed["kinds"] == []
    assert walked == []
    # a lumpy client side is walked once more to name the lumps
    lumpy = tracked(model, 2, 0.0)
    requested(lumpy, 0.0)
    lumpy.read("upstream", Direction.DOWNSTREAM, HEAD, 0.05)
    for i in range(40):
        lumpy.read("upstream", Direction.DOWNSTREAM, chunk(EVENT), 0.1 + 0.05 * i)
    lumpy.wrote("client", Direction.DOWNSTREAM, HEAD + chunk(EVENT) * 40, 2.1)
    model.refresh()
    assert model.listing(2.2)["connections"][0]["kinds"] == ["buffering"]
    assert walked == [1]


async def request(console: Console, *targets: str) -> list[bytes]:
    """Ask `targets` in turn on one keep-alive connection to the console (a memory stream);
    the answers' bodies."""
    server, client = trio.testing.memory_stream_pair()
    them = h11.Connection(h11.CLIENT)
    bodies: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(console.serve_connection, server)
        for target in targets:
            await client.send_all(
                them.send(h11.Request(method="GET", target=target, headers=[("host", "x")])) or b""
            )
            await client.send_all(them.send(h11.EndOfMessage()) or b"")
            body = bytearray()
            while not isinstance(event := them.next_event(), h11.EndOfMessage):
                if event is h11.NEED_DATA:
                    them.receive_data(await client.receive_some(65536))
                elif isinstance(event, h11.Data):
                    body += event.data
            bodies.append(bytes(body))
            them.start_next_cycle()
        nursery.cancel_scope.cancel()
    return bodies


async def test_the_console_counts_the_pages_cpu_and_nothing_else(
    mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a fake CPU clock that only the model's work moves: the refresh (done with or
    without a page) costs 1 s a call, a list 0.1 ms, a detail 0.01 ms. The pages' total is
    every list and detail the feed and the requests made, and no refresh."""
    mock_clock.autojump_threshold = 0
    cpu = [0.0]
    calls = {"refresh": 0, "listing": 0, "stream": 0}
    console = Console(a_proxy(), cpu_clock=lambda: cpu[0])
    two_streams(console.model)

    def costing(name: str, cost: float) -> None:
        inner = getattr(console.model, name)

        def costly(*args: object, **kwargs: object) -> object:
            calls[name] += 1
            cpu[0] += cost
            return inner(*args, **kwargs)

        monkeypatch.setattr(console.model, name, costly)

    costing("refresh", 1.0)
    costing("listing", 1e-4)
    costing("stream", 1e-5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(console.refresh_forever)
        await trio.sleep(2.0)  # no page attached: the refreshes cost, the pages nothing
        assert calls["refresh"] >= 20 and console.page_cpu == 0.0
        (stats,) = await request(console, "/api/stats")  # the measurer's: not a page's
        assert json.loads(stats)["page_cpu_s"] == 0.0 and json.loads(stats)["pages"] == 0
        assert console.page_cpu == 0.0
        # a page: its feed for 2 s, meanwhile its detail asked twice and the list once
        nursery.start_soon(feed_updates, console, 2.0)
        await trio.sleep(1.0)
        assert console.pages == 1
        await request(console, "/api/streams/2", "/api/connections", "/api/streams/1")
        await trio.sleep(1.5)
        assert console.pages == 0
        nursery.cancel_scope.cancel()
    assert calls["listing"] >= 10 and calls["stream"] == 2
    assert calls["refresh"] >= 40  # it ran all along, between the page's turns
    expected = 1e-4 * calls["listing"] + 1e-5 * calls["stream"]
    assert console.page_cpu == pytest.approx(expected)
    (stats,) = await request(console, "/api/stats")
    assert json.loads(stats)["page_cpu_s"] == pytest.approx(expected)
