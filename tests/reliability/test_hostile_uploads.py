"""Hostile input to the control API and to scenario loading: a YAML alias bomb made of
strings, scenario uploads that take seconds to refuse (parsed in a child process, once,
while the data plane keeps streaming), a burst of them (bounded parse slots, then 503),
a scenario name that is a symlink out of `--scenario-dir`, and partial request heads
while the proxy waits for `X-Middlebox-Scenario` (real sockets on 127.0.0.1, bounded)."""

from __future__ import annotations

import json
import os
import socket
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner
from trio.testing import MockClock

from middlebox.cli.main import main
from middlebox.run.serve import LIBRARY_SCENARIOS
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.model import Scenario
from middlebox.shell import control
from middlebox.shell.control import ControlApi, ControlledProxy, pass_through
from middlebox.shell.scenario_parse import parse_in_child
from middlebox.shell.server import Address, ProxyConfig
from tests.shell.support import Running, controlled, http, read_head

# 20 faults, each stripping the same 30 header names of 20,000 characters: 1,267 nodes
# and a 21 KB file, but 12 MB of values once the aliases are expanded (and twice that in
# the control API's JSON answer, which lists the path and the document).
STRING_BOMB = (
    "name: bomb\nexpect:\n"
    f"  s: &s {'x' * 20_000}\n"
    "  l: &l [" + ", ".join(["*s"] * 30) + "]\n"
    "path:\n" + "  - strip_header: {headers: *l}\n" * 20
)
# A flat list of 233,000 values (700 KB): over the 100,000-value limit.
FLAT_LIST = ("name: flat\npath: []\nexpect: [" + ", ".join(["x"] * 233_000) + "]\n").encode()


def test_a_string_alias_bomb_is_refused_by_validate_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(STRING_BOMB)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code != 0
    # the first fault's `*l` (line 6, column 29) takes the values past 1 MiB
    assert f"{path}:6:29: more than 1048576 characters of values once aliases are expanded" in (
        result.output
    )


async def test_a_string_alias_bomb_put_to_the_control_api_is_a_small_400() -> None:
    with trio.fail_after(30):
        async with streaming() as run:
            status, body, _ = await http(run.control_port, "PUT", "/scenario", STRING_BOMB.encode())
            assert status == 400 and len(body) < 1000
            assert "characters of values once aliases are expanded" in body.decode()
            assert run.proxy.scenario.name == "pass-through"


# ------------------------------------------------------------ a live stream meanwhile


async def ticking_upstream(stream: trio.SocketStream) -> None:
    """A chunked event stream with an event every 5 ms, until the client goes (<= 60 s)."""
    if not await read_head(stream):
        return
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    event = b"data: tick\n\n"
    with trio.move_on_after(60):
        try:
            await stream.send_all(head)
            while True:
                await stream.send_all(b"%x\r\n%s\r\n" % (len(event), event))
                await trio.sleep(0.005)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


def streaming(scenario_dir: Path | None = None) -> AbstractAsyncContextManager[Running]:
    """A controlled proxy (control API on the same event loop) before `ticking_upstream`."""
    return controlled(scenario_dir=scenario_dir, upstream_handler=ticking_upstream)


async def largest_gap_while(run: Running, uploads: list[bytes]) -> tuple[float, list[int]]:
    """Stream through the proxy while `uploads` are PUT at once; the largest gap between
    two reads at the client while they ran, and the statuses they got."""
    client = await trio.open_tcp_stream("127.0.0.1", run.proxy_port)
    await client.send_all(b"GET /v1/stream HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await client.receive_some(65536)  # the stream flows before the uploads start
    statuses: list[int] = []
    gaps: list[float] = []

    async def put(body: bytes) -> None:
        statuses.append((await http(run.control_port, "PUT", "/scenario", body))[0])

    async with trio.open_nursery() as nursery:
        for body in uploads:
            nursery.start_soon(put, body)
        last = trio.current_time()
        while len(statuses) < len(uploads):
            assert await client.receive_some(65536)
            now = trio.current_time()
            gaps.append(now - last)
            last = now
    await client.aclose()
    return max(gaps), statuses


async def test_a_refused_700_kb_upload_leaves_a_live_stream_s_largest_gap_under_200_ms() -> None:
    with trio.fail_after(60):
        async with streaming() as run:
            gap, statuses = await largest_gap_while(run, [FLAT_LIST])
    assert statuses == [400]
    assert gap < 0.2, f"the live stream stalled {gap:.3f} s while an upload was refused"


async def test_a_burst_of_uploads_is_parsed_two_at_a_time_and_the_rest_told_to_retry() -> None:
    with trio.fail_after(90):
        async with streaming() as run:
            gap, statuses = await largest_gap_while(run, [FLAT_LIST] * 8)
    assert set(statuses) <= {400, 503}
    # two parse slots and four waiting: at least two are told at once to come back
    assert statuses.count(503) >= 8 - 2 - control.MAX_PARSES_WAITING
    assert statuses.count(400) >= 2
    assert gap < 0.2, f"the live stream stalled {gap:.3f} s during eight uploads"


async def test_a_busy_answer_says_when_to_retry() -> None:
    with trio.fail_after(10):
        async with streaming() as run:
            api = ControlApi(run.proxy)
            api.parse_slots.total_tokens = 0  # every slot taken
            api.parses_waiting = control.MAX_PARSES_WAITING
            answer = await api.answer("PUT", "/scenario", {}, b"name: x\n")
    assert answer.status == 503 and ("retry-after", "1") in answer.headers


async def test_an_upload_parse_is_killed_at_its_time_budget_and_refused() -> None:
    with trio.fail_after(10):
        parsed = await parse_in_child(LIBRARY_SCENARIOS, FLAT_LIST, "<up>", budget=0.05)
    assert parsed.scenario is None
    assert parsed.problems == ("<up>:1:1: not parsed within 0.05 s; refused",)


async def test_an_upload_parse_is_bounded_in_memory_and_refused_past_it() -> None:
    with trio.fail_after(30):
        parsed = await parse_in_child(LIBRARY_SCENARIOS, FLAT_LIST, "<up>", memory=1 << 20)
    assert parsed.scenario is None
    (problem,) = parsed.problems
    assert problem.startswith("<up>:1:1: parsing failed within 1 MiB of memory")


async def test_an_upload_is_parsed_in_a_child_process_once() -> None:
    with trio.fail_after(30):
        good = await parse_in_child(LIBRARY_SCENARIOS, b"name: ok\npath: [latency]\n", "<up>")
        bad = await parse_in_child(LIBRARY_SCENARIOS, b"name: x\npath: [latencyy]\n", "<up>")
        binary = await parse_in_child(LIBRARY_SCENARIOS, b"\xff\xfe", "<up>")
    assert good.scenario is not None and [s.name for s in good.scenario.path] == ["latency"]
    assert bad.scenario is None and "unknown fault 'latencyy'" in bad.problems[0]
    assert binary.error == "the body must be UTF-8 YAML"


def test_a_refusal_with_thousands_of_problems_answers_the_first_hundred() -> None:
    proxy = ControlledProxy(
        ProxyConfig(Address("127.0.0.1", 9), Scenario(name="x")), loader=LIBRARY_SCENARIOS
    )
    body = ("name: x\n" + "".join(f"k{i}: 1\n" for i in range(5000))).encode()
    response = ControlApi(proxy).route("PUT", "/scenario", {}, body)
    answer = json.loads(response.body)
    assert response.status == 400 and len(response.body) < 40_000
    assert len(answer["problems"]) == 100 and answer["more_problems"] == 4900


# ------------------------------------------------------------ --scenario-dir and its header


async def test_a_scenario_name_that_links_out_of_the_scenario_dir_is_refused(
    tmp_path: Path,
) -> None:
    inside, outside = tmp_path / "scenarios", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (outside / "secret.yaml").write_text("name: secret\npath:\n  - latency: {delay: 1ms}\n")
    (inside / "escape.yaml").symlink_to(outside / "secret.yaml")
    (inside / "real.yaml").write_text("name: real\npath: []\n")
    (inside / "alias.yaml").symlink_to(inside / "real.yaml")  # a link inside stays usable
    proxy = ControlledProxy(
        ProxyConfig(Address("127.0.0.1", 9), pass_through()),
        scenario_dir=inside,
        loader=LIBRARY_SCENARIOS,
    )
    with pytest.raises(LookupError):
        proxy.named_scenario("escape")
    assert proxy.named_scenario("alias").name == "real"
    assert proxy.named_scenarios() == ["alias", "real"]


class CountingSocket(socket.socket):
    """A socket that counts its peeks (MSG_PEEK reads) of the waiting request head."""

    peeks = 0  # per instance once counted (a socket.socket subclass has a __dict__)

    def recv(self, size: int, flags: int = 0) -> bytes:
        if flags & socket.MSG_PEEK:
            self.peeks += 1
        return super().recv(size, flags)


async def test_a_partial_head_is_peeked_once_per_arrival_not_every_few_milliseconds(
    autojump_clock: MockClock,
) -> None:
    # TCP on loopback, as the proxy's clients (a Unix socketpair ignores SO_RCVLOWAT in poll)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        right = socket.create_connection(listener.getsockname())
        left, _ = listener.accept()
    counting = CountingSocket(left.family, left.type, left.proto, fileno=os.dup(left.fileno()))
    left.close()
    counting.setblocking(False)
    try:
        right.sendall(b"POST /v1/x HTTP/1.1\r\nHost: x\r\n")
        async with trio.open_nursery() as nursery:
            heads: list[bytes] = []

            async def peek() -> None:
                heads.append(await control.peek_head(counting))

            nursery.start_soon(peek)
            await trio.sleep(0.3)  # the head stays partial: nothing new to look at
            right.sendall(b"X-Middlebox-Scenario: slow\r\n")
            await trio.sleep(0.3)
            right.sendall(b"\r\n")
        assert heads == [b"POST /v1/x HTTP/1.1\r\nHost: x\r\nX-Middlebox-Scenario: slow\r\n\r\n"]
        assert counting.peeks <= 3, f"{counting.peeks} peeks for a head sent in three pieces"
        # the peeked head is still in the socket, whole, for the relay
        assert counting.recv(65536) == heads[0]
    finally:
        counting.close()
        right.close()


def test_the_scenario_loader_still_refuses_what_it_refused(tmp_path: Path) -> None:
    # the one-pass loader keeps the file:line:col of the two-pass one
    with pytest.raises(ScenarioError, match=r"s.yaml:3:\d+: more than 100000 values"):
        LIBRARY_SCENARIOS.text(FLAT_LIST.decode(), "s.yaml")
