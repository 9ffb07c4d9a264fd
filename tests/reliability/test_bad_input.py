"""Bad input, each answered with a clear error and nothing lost: broken scenario files,
impossible combinations (warnings), malformed HTTP from either peer, oversized heads,
invalid UTF-8 and JSON inside events, and requests the emulator must refuse like vLLM."""

from __future__ import annotations

import itertools
import json
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio
from click.testing import CliRunner

from faults import REGISTRY
from faults.testing import replay
from middlebox.cli.main import main
from middlebox.clients import BUILTIN_CLIENTS
from middlebox.compose import PROXY_STAGES, load, scenario_sections
from middlebox.core.fault import Fault
from middlebox.core.stream import Chunk, Direction, Eof, Item, Reset
from middlebox.run.score import score_client
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.load import MAX_SCENARIO_BYTES, load_scenario_text
from middlebox.scenario.model import ProxyOptions, Scenario
from middlebox.scenario.workload import Workload, workload_file
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, listen
from tests.clients.wire_server import END_CHUNK, SSE_HEAD, chat_frame, http_chunk
from tests.harness import free_port, proxied, read_all, send_in_pieces
from tests.proxy_process import emulator_process
from tests.reliability.support import fd_baseline, fds_back_to
from tests.request_readers import KeepAliveRequests

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------- scenario files


def problems_of(text: str) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(text, REGISTRY, file="s.yaml", sections=scenario_sections())
    return str(caught.value)


LEVEL = "[" + ", ".join(["x"] * 9) + "]"
BOMB = (
    f"a: &a {LEVEL}\n"
    + "".join(
        f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
        for prev, name in zip("abcdef", "bcdefg", strict=True)
    )
    + "name: bomb\nexpect: *g\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "s.yaml:1:1: a scenario must be a mapping with at least `name:` and `path:`"),
        ("- latency\n- slicer\n", "s.yaml:1:1: a scenario must be a mapping"),
        ("just a string\n", "s.yaml:1:1: a scenario must be a mapping"),
        ("name: a\x00b\n", "s.yaml:1:8: not a YAML text file: special characters"),
        ("name: a\n---\nname: b\n", "s.yaml:2:1: YAML syntax error: expected a single document"),
        ("name: a\npath: [latency\n", "s.yaml:3:1: YAML syntax error"),
        (
            "name: a\npath:\n  - latencyy: {}\n",
            "unknown fault 'latencyy' (did you mean 'latency'?)",
        ),
        ("name: a\npath:\n  - latency: {dealy: 1s}\n", "unknown field 'dealy'; valid fields:"),
        ("name: a\npath:\n  - latency: {delay: 5 parsecs}\n", "latency.delay: expected a duration"),
        ("name: a\npath:\n  - latency: {delay: -1}\n", "a duration cannot be negative"),
        ("name: a\npath:\n  - latency: [1, 2]\n", "expected a mapping of its fields, got a list"),
        ("name: a\npath: {latency: {}}\n", "path: expected a list of faults in path order"),
        ("name: [a]\n", "name: expected string, got a list"),
        ("name: a\nseed: seven\n", "seed: expected integer, got 'seven'"),
        ("name: a\nsurprise: 1\n", "unknown top-level key 'surprise'; valid keys:"),
        ("name: a\nname: b\n", "duplicate key 'name'"),
        ("name: a\nproxy: {max_connections: 0}\n", "max_connections must be at least 1"),
        ("name: a\nproxy: {read_timeout: 0s}\n", "read_timeout must be positive"),
        ("name: a\nproxy: {sse_max_line: 0}\n", "s.yaml:2:8: proxy: sse_max_line must be at least"),
        ("name: a\nproxy: {sse_max_event: lots}\n", "proxy.sse_max_event: expected a size"),
        ("name: a\nproxy: {client_header_timeout: soon}\n", "client_header_timeout: expected"),
        ("name: a\nproxy: {on_upstream_unreachable: 503}\n", "503 is not valid; choose one of"),
        ("name: a\nworkload: {requests: 0}\n", "requests and concurrency must be at least 1"),
        (BOMB, "more than 100000 values once aliases are expanded"),
    ],
)
def test_a_broken_scenario_is_refused_with_file_line_and_reason(text: str, expected: str) -> None:
    assert expected in problems_of(text)


def test_every_problem_in_a_file_is_reported_at_once() -> None:
    text = "name: a\nseed: x\npath:\n  - latency: {delay: 1 fortnight}\n  - nosuch\n"
    assert len(problems_of(text).splitlines()) == 3


def test_an_alias_bomb_is_refused_quickly() -> None:
    started = time.perf_counter()
    problems_of(BOMB)
    assert time.perf_counter() - started < 1


def test_a_binary_file_is_refused_as_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "image.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    with pytest.raises(ScenarioError, match=r"image.yaml:1:1: not a UTF-8 text file \(byte 0\)"):
        load(path)


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("w") as out:
        out.write("name: huge\ndescription: '")
        out.write("x" * MAX_SCENARIO_BYTES)
        out.write("'\n")
    with pytest.raises(
        ScenarioError, match=r"huge.yaml:1:1: too large: \d+ bytes \(limit 1048576\)"
    ):
        load(path)


def test_validate_reports_a_broken_file_and_still_checks_the_others(tmp_path: Path) -> None:
    (tmp_path / "a-good.yaml").write_text("name: good\npath: [latency]\n")
    (tmp_path / "b-binary.yaml").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "c-list.yaml").write_text("- nope\n")
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 1
    assert "ok: " in result.output and "a-good.yaml" in result.output
    assert "b-binary.yaml:1:1: not a UTF-8 text file" in result.output
    assert "c-list.yaml:1:1: a scenario must be a mapping" in result.output


# ------------------------------------------------- impossible combinations: warnings


@dataclass
class CutAtEvent(Fault):
    """A stand-in for an event-counting fault (the cut fault's `after_events`)."""

    name: ClassVar[str] = "cut_at_event"
    after_events: int = 1


@dataclass
class SelfChecking(Fault):
    name: ClassVar[str] = "self_checking"

    def scenario_warnings(self, workload: Any) -> list[str]:
        return [f"needs streaming, workload stream={workload.stream}"]


def test_a_cut_after_more_events_than_the_stream_has_is_a_warning_not_an_error() -> None:
    registry = {**REGISTRY, "cut_at_event": CutAtEvent, "self_checking": SelfChecking}
    text = (
        "name: impossible\n"
        "workload: {max_tokens: 10, timeout: 5s, stream: false}\n"
        "path:\n"
        "  - cut_at_event: {after_events: 15}\n"
        "  - cut_at_event: {after_events: 14}\n"
        "  - handoff: {at: 30s}\n"
        "  - self_checking\n"
    )
    scenario = load_scenario_text(text, registry, file="i.yaml", sections=scenario_sections())
    warnings = [str(warning) for warning in scenario.warnings]
    assert warnings == [
        "i.yaml:4:1: path[0] cut_at_event: after_events: 15 can never be reached: with "
        "workload max_tokens 10 a stream has at most 14 events",
        "i.yaml:6:1: path[2] handoff: at: 30s is after the workload's timeout (5s): it never fires",
        "i.yaml:7:1: path[3] self_checking: needs streaming, workload stream=False",
    ]
    assert len(scenario.path) == 4  # it loads and runs; the faults just never fire


def test_the_cut_fault_after_more_events_or_tokens_than_max_tokens_allows_warns() -> None:
    text = (
        "name: cut-late\n"
        "workload: {max_tokens: 10, timeout: 5s}\n"
        "path:\n"
        "  - cut: {after: events, count: 15}\n"
        "  - cut: {after: tokens, count: 11}\n"
        "  - cut: {after: events, count: 14}\n"  # possible: right after [DONE]
        "  - cut: {after: time, time: 6s}\n"
    )
    scenario = load_scenario_text(text, REGISTRY, file="c.yaml", sections=scenario_sections())
    assert [str(warning) for warning in scenario.warnings] == [
        "c.yaml:4:1: path[0] cut: count: cutting after 15 events never happens: with "
        "workload max_tokens 10 a stream has at most 14 events",
        "c.yaml:5:1: path[1] cut: count: cutting after 11 tokens never happens: with "
        "workload max_tokens 10 a stream has at most 10 tokens",
        "c.yaml:7:1: path[3] cut: time: 6s is after the workload's timeout (5s): it never fires",
    ]


def test_validate_prints_warnings_and_still_exits_zero(tmp_path: Path) -> None:
    path = tmp_path / "late.yaml"
    path.write_text("name: late\nworkload: {timeout: 2s}\npath:\n  - handoff: {at: 1min}\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert f"warning: {path}:4:1: path[0] handoff: at: 60s is after the workload's timeout" in (
        result.output
    )


# ------------------------------------------------------- malformed HTTP, either peer

GARBAGE_REQUESTS = [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),  # a TLS ClientHello
    b"GET / HTTP/9.9\r\nHost x\r\n\r\n",  # bad version, header without a colon
    b"POST / HTTP/1.1\r\nContent-Length: -5\r\nContent-Length: 7\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nnot hex\r\n0\r\n\r\n",
    b"\r\n\r\n\r\n\x00\x00\x00",
    b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (1024 * 1024) + b"\r\n\r\n",  # a 1 MiB header
]
GARBAGE_RESPONSES = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\nshort",
    b"HTTP/1.1 2xx Maybe\r\n\r\n\xff\xfe",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    b"not http at all\n" * 1000,
    b"HTTP/1.1 200 OK\r\n" + b"X-Huge: " + b"b" * (512 * 1024) + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'20\r\ndata: {"choices": \xff\xfe [}\n\n\r\n\r\n',
]


@pytest.mark.parametrize("request_bytes", GARBAGE_REQUESTS, ids=lambda b: repr(b[:12]))
async def test_malformed_requests_pass_through_byte_exact(request_bytes: bytes) -> None:
    seen: list[bytes] = []

    async def upstream(stream: trio.SocketStream) -> None:
        data, _ = await read_all(stream)
        seen.append(data)
        await stream.send_all(b"upstream decides")
        await stream.send_eof()

    baseline = fd_baseline()
    with trio.fail_after(10):
        async with proxied(upstream) as running:
            client = await running.connect()
            await send_in_pieces(client, request_bytes, [1, 7, len(request_bytes) // 2])
            await client.send_eof()
            received, end = await read_all(client)
            await client.aclose()
    assert seen == [request_bytes]
    assert (received, end) == (b"upstream decides", "fin")
    assert await fds_back_to(baseline) == baseline


@pytest.mark.parametrize("response", GARBAGE_RESPONSES, ids=lambda b: repr(b[:12]))
async def test_malformed_responses_pass_through_byte_exact(response: bytes) -> None:
    async def upstream(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await send_in_pieces(stream, response, [3, len(response) // 3])
        await stream.send_eof()

    with trio.fail_after(10):
        async with proxied(upstream) as running:
            client = await running.connect()
            await client.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            received, end = await read_all(client)
            await client.aclose()
    assert (received, end) == (response, "fin")


def default_fault(cls: type[Fault]) -> Fault:
    """The fault with its defaults, or with a trigger when it needs one (`at`)."""
    try:
        return cls()
    except ValueError:
        return cls(at=0.5)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_fault_takes_malformed_traffic_both_ways_without_raising(name: str) -> None:
    """HTTP-aware faults parse what they see; garbage must degrade, never raise (an
    exception would kill the connection with a log line instead of passing it on)."""
    cls = REGISTRY[name]
    runs = 0
    # The megabyte heads are left out: the slicer's one-byte writes make them slow to
    # replay, and they cross the real proxy in the tests above.
    requests = [request for request in GARBAGE_REQUESTS if len(request) < 64 * 1024]
    responses = [response for response in GARBAGE_RESPONSES if len(response) < 64 * 1024]
    for index, (request, response) in enumerate(itertools.product(requests, responses)):
        for end in (Eof, Reset):
            rng = random.Random(index)
            timeline: list[tuple[float, Item]] = [
                (0.001 * i, Chunk(Direction.UPSTREAM, part))
                for i, part in enumerate(random_split(request, rng))
            ]
            timeline += [
                (0.1 + 0.001 * i, Chunk(Direction.DOWNSTREAM, part))
                for i, part in enumerate(random_split(response, rng))
            ]
            timeline += [(0.3, end(Direction.UPSTREAM)), (0.4, end(Direction.DOWNSTREAM))]
            output = replay(default_fault(cls), timeline, until=600, seed=index)
            assert all(isinstance(item, Chunk | Eof | Reset) for _, item in output)
            runs += 1
    assert runs == 2 * len(requests) * len(responses) == 2 * 5 * 5


def random_split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(4)))
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


async def refused(request_bytes: bytes, **proxy: object) -> tuple[bytes, str, ProxyServer]:
    """What a client gets from a proxy whose upstream is down (nginx parses the head)."""
    scenario = Scenario(name="down", proxy=ProxyOptions(**proxy))  # type: ignore[arg-type]
    config = ProxyConfig(Address("127.0.0.1", free_port()), scenario, stages=PROXY_STAGES)
    server = ProxyServer(config)
    listener = listen(Address("127.0.0.1", 0))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, listener)
        with trio.fail_after(10):
            client = await trio.open_tcp_stream("127.0.0.1", port)
            try:
                await client.send_all(request_bytes)
            except trio.BrokenResourceError:
                pass  # the proxy answered and closed before we finished sending
            received, end = await read_all(client)
            await client.aclose()
        nursery.cancel_scope.cancel()
    listener.close()
    return received, end, server


async def test_when_the_proxy_parses_the_head_a_malformed_one_gets_nginx_s_400() -> None:
    received, _, server = await refused(b"GARBAGE\x00 / HTTP/1.1\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 400 Bad Request\r\nServer: nginx\r\n")
    assert b"<center><h1>400 Bad Request</h1></center>" in received
    assert server.connections_failed == 1


async def test_when_the_proxy_parses_the_head_an_oversized_one_gets_400_too_large() -> None:
    received, _, _ = await refused(b"GET / HTTP/1.1\r\nCookie: " + b"c" * 40_000 + b"\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"<center>Request Header Or Cookie Too Large</center>" in received


async def test_when_the_proxy_parses_the_head_a_slow_one_is_closed_unanswered() -> None:
    received, end, _ = await refused(b"GET / HTTP/1.1\r\nHost: x\r\n", client_header_timeout=0.2)
    assert (received, end) == (b"", "fin")


# ------------------------------------------- invalid UTF-8 and JSON inside SSE events

BAD_EVENTS = [
    chat_frame(None, role=True),
    chat_frame("fine "),
    b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe\xc3"}}]}\n\n',  # bad UTF-8
    b"data: {not json at all\n\n",
    b"data: [1, 2\n\n",
    b"data: null\n\n",
    b'data: {"choices": "not a list"}\n\n',
    b"event: weird\ndata: \xed\xa0\x80\n\n",  # a UTF-8-encoded surrogate
    chat_frame(None, "stop"),
    b"data: [DONE]\n\n",
]
BAD_STREAM = SSE_HEAD + b"\r\n" + b"".join(http_chunk(event) for event in BAD_EVENTS) + END_CHUNK


async def serve_bad_stream(stream: trio.SocketStream) -> None:
    """Answer every request on the connection (keep-alive) with BAD_STREAM."""
    requests = KeepAliveRequests(stream)
    try:
        while await requests.next_head() is not None:
            await stream.send_all(BAD_STREAM)
    except trio.BrokenResourceError:
        return


async def test_invalid_utf8_and_json_in_events_pass_through_and_no_client_crashes(
    tmp_path: Path,
) -> None:
    clients = ["raw", "openai", "httpx-sse", "resilient"]
    document = workload_file(Workload(requests=1, max_tokens=8, timeout=10), "bad", "c", "m")
    (tmp_path / "workload.json").write_text(json.dumps(document))
    with trio.fail_after(40):
        async with proxied(serve_bad_stream) as running:
            env = {
                **os.environ,
                "OPENAI_BASE_URL": f"http://127.0.0.1:{running.proxy_port}/v1",
                "OPENAI_API_KEY": "sk-test",
                "MIDDLEBOX_WORKLOAD": str(tmp_path / "workload.json"),
            }
            codes: dict[str, int] = {}

            async def one(name: str) -> None:
                result = await trio.run_process(
                    BUILTIN_CLIENTS[name],
                    env={**env, "MIDDLEBOX_RESULT": str(tmp_path / f"{name}.json")},
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
                codes[name] = result.returncode

            async with trio.open_nursery() as nursery:
                for name in clients:
                    nursery.start_soon(one, name)
            # the raw bytes cross the proxy unchanged
            probe = await running.connect()
            await probe.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            received = b""
            while not received.endswith(END_CHUNK):
                received += await probe.receive_some(65536)
            await probe.aclose()
    assert received == BAD_STREAM
    assert codes == dict.fromkeys(clients, 0)  # a result written, whatever the errors
    for name in clients:
        result = json.loads((tmp_path / f"{name}.json").read_text())["results"][0]
        assert result["text"].startswith("fine ") or result["error"], (name, result)
        score = score_client(
            "bad", name, ["[middlebox bad/c/0]"], {"client": name, "results": [result]},
            [], [(b"POST / HTTP/1.1\r\n\r\n", BAD_STREAM)], [], [],
        )  # fmt: skip
        assert score.client == name  # the scorer reads the garbage without crashing


# ------------------------------------------------ the emulator refuses like vLLM


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with emulator_process(cwd=ROOT) as url:
        yield url


def call(url: str, body: bytes | None, content_type: str = "application/json") -> Any:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_emulator_answers_a_request_with_every_field_wrong_with_vllm_s_400(
    emulator: str,
) -> None:
    body = {
        "model": 5,
        "messages": "hello",
        "max_tokens": "many",
        "stream": "yes",
        "temperature": "hot",
        "n": [],
    }
    status, answer = call(f"{emulator}/v1/chat/completions", json.dumps(body).encode())
    assert status == 400
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "Bad Request" and error["code"] == 400
    assert error["message"].split(":")[0].endswith("validation errors")
    assert error["param"].startswith("body.")


@pytest.mark.parametrize(
    ("body", "content_type", "status", "kind", "fragment"),
    [
        (b"{not json", "application/json", 400, "Bad Request", ""),
        (b"{}", "text/plain", 400, "Bad Request", "Unsupported Media Type"),
        (b"[]", "application/json", 400, "Bad Request", "validation error"),
        (
            b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}',
            "application/json",
            404,
            "NotFoundError",
            "The model `nope` does not exist.",
        ),
    ],
)
def test_the_emulator_refuses_broken_bodies_with_vllm_error_shapes(
    emulator: str, body: bytes, content_type: str, status: int, kind: str, fragment: str
) -> None:
    got_status, answer = call(f"{emulator}/v1/chat/completions", body, content_type)
    assert got_status == status
    assert answer["error"]["type"] == kind and answer["error"]["code"] == status
    assert fragment in answer["error"]["message"]


def test_the_emulator_still_serves_after_every_bad_request(emulator: str) -> None:
    model = call(f"{emulator}/v1/models", None)[1]["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    status, answer = call(f"{emulator}/v1/chat/completions", json.dumps(body).encode())
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length"


# ------------------------------------------------ scenario depth, size and number limits


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("name: x\npath: " + "[" * 5000 + "\n", "<deep>:2:70:", "nested more than 64 deep"),
        ("name: x\nseed: " + "9" * 5000 + "\npath: []\n", "<deep>:2:7:", "a number of 5000"),
    ],
)
def test_deep_nesting_and_huge_numbers_are_located_problems_not_tracebacks(
    text: str, where: str, says: str
) -> None:
    with pytest.raises(ScenarioError) as raised:
        load_scenario_text(text, REGISTRY, file="<deep>", sections=scenario_sections())
    (problem,) = raised.value.problems
    assert str(problem).startswith(where) and says in str(problem)


def test_put_scenario_is_parsed_off_the_event_loop_and_a_bad_one_is_a_400() -> None:
    from middlebox.run.serve import LIBRARY_SCENARIOS
    from middlebox.shell.control import ControlApi, ControlledProxy
    from middlebox.shell.scenario_parse import Parsed

    proxy = ControlledProxy(
        ProxyConfig(Address("127.0.0.1", 9), Scenario(name="x")), loader=LIBRARY_SCENARIOS
    )
    api = ControlApi(proxy)
    good = b"name: swapped\npath:\n  - latency: {delay: 5ms}\n"
    here = api.parse_here

    def refused(body: bytes) -> Parsed:
        raise AssertionError("parsed in the control API's own process")

    api.parse_here = refused  # type: ignore[method-assign]
    # the socket path (`answer`) parses in a child process, never here
    assert trio.run(api.answer, "PUT", "/scenario", {}, good).status == 200
    assert proxy.scenario.name == "swapped"
    bad = ("name: x\npath: " + "[" * 5000 + "\n").encode()
    response = trio.run(api.answer, "PUT", "/scenario", {}, bad)
    assert response.status == 400 and b"nested more than 64 deep" in response.body
    api.parse_here = here  # type: ignore[method-assign]
    assert api.route("PUT", "/scenario", {}, bad).status == 400  # no socket: parsed here
