"""What the control API (and the console, on its port) tells a sender it cannot serve: a
malformed HTTP request gets a 400 with h11's reason in one line, then the close, never an
empty reply; `?ignore=` names only blocks a live proxy leaves alone; a body that is no JSON
or YAML is placed at its line and column; and every 404 lists the routes that port serves,
taken from its routing table. Raw sockets on 127.0.0.1 for the wire, `route` for the rest."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from middlebox.console.server import CONSOLE_ROUTES
from middlebox.library import scenario_dir
from middlebox.shell.control import CONTROL_ROUTES, ControlApi
from tests.console.test_console_server import console_running
from tests.harness import read_all
from tests.shell.support import controlled, http
from tests.shell.test_control_faults import api_for, call

CONTROL_ROUTE_NAMES = [
    "GET /metrics",
    "GET|PUT|DELETE /scenario",
    "GET|POST|DELETE /faults",
    "GET|PATCH|DELETE /faults/{index|name}",
    "GET /scenarios",
    "POST /counters/reset",
    "GET /journals",
    "GET /journals/{id}",
]


async def exchange(port: int, data: bytes) -> tuple[bytes, Any, str]:
    """Send raw bytes; (status line, the JSON body, how the connection ended)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    received, ended = await read_all(stream)
    await stream.aclose()
    head, _, body = received.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body) if body else None, ended


MALFORMED = [
    pytest.param(b"HELLO THERE\r\n\r\n", b"HTTP/1.1 400 Bad Request", id="garbage-request-line"),
    pytest.param(
        b"POST /faults HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        id="content-length-abc",
    ),
    pytest.param(
        # a head still without its end past h11's 16 KiB bound
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n",
        b"HTTP/1.1 431 Request Header Fields Too Large",
        id="head-over-16KiB",
    ),
]


@pytest.mark.parametrize(("data", "status_line"), MALFORMED)
async def test_a_malformed_request_gets_a_400_with_its_reason_then_the_close(
    data: bytes, status_line: bytes
) -> None:
    with trio.fail_after(10):
        async with controlled() as run:
            line, answer, ended = await exchange(run.control_port, data)
            assert line == status_line
            assert answer["error"].startswith("bad HTTP request: ")
            assert "\n" not in answer["error"] and ended == "fin"
            # the port goes on serving well-formed requests
            assert (await http(run.control_port, "GET", "/faults"))[0] == 200


async def test_a_well_formed_request_after_a_good_one_on_the_same_connection_gets_no_400() -> None:
    request = b"GET /faults HTTP/1.1\r\nHost: x\r\n\r\n"
    with trio.fail_after(10):
        async with controlled() as run:
            last = request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
            stream = await trio.open_tcp_stream("127.0.0.1", run.control_port)
            await stream.send_all(request + last)
            received, ended = await read_all(stream)
            await stream.aclose()
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 2 and b" 400 " not in received
    assert ended == "fin"


async def test_garbage_after_a_good_request_on_a_kept_connection_gets_a_200_then_a_400() -> None:
    # the second request on a keep-alive connection is garbage: one 200, then one 400
    good = b"GET /faults HTTP/1.1\r\nHost: x\r\n\r\n"
    with trio.fail_after(10):
        async with controlled() as run:
            stream = await trio.open_tcp_stream("127.0.0.1", run.control_port)
            await stream.send_all(good + b"\x00\x01 nonsense\r\n\r\n")
            received, _ = await read_all(stream)
            await stream.aclose()
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 400 Bad Request\r\n" in received


@pytest.mark.parametrize(("data", "status_line"), MALFORMED[:2])
async def test_the_console_port_answers_a_malformed_request_the_same_way(
    data: bytes, status_line: bytes
) -> None:
    with trio.fail_after(10):
        async with console_running() as (_, _, ui_port):
            line, answer, ended = await exchange(ui_port, data)
    assert line == status_line and answer["error"].startswith("bad HTTP request: ")
    assert ended == "fin"


def test_an_ignore_name_that_is_no_live_block_is_a_400_naming_it_and_the_ones_taken() -> None:
    api = api_for()
    body = (scenario_dir() / "healthy-baseline.yaml").read_bytes()
    status, answer = call(api, "PUT", "/scenario?ignore=bogus,upstream,wrkload", body)
    assert status == 400
    assert answer["error"] == (
        "ignore= names no block a live proxy leaves alone: bogus, wrkload "
        "(it takes upstream, workload)"
    )
    assert api.proxy.scenario.name == "pass-through"
    assert call(api, "PUT", "/scenario?ignore=upstream,workload", body)[0] == 200


async def test_a_bad_ignore_is_refused_before_the_body_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = api_for()

    async def never(body: bytes) -> object:
        raise AssertionError("parsed a body whose query was refused")

    monkeypatch.setattr(api, "parse_upload", never)
    response = await api.answer("PUT", "/scenario?ignore=bogus", {}, b"name: x\npath: []\n")
    assert response.status == 400 and b"bogus" in response.body


@pytest.mark.parametrize(
    ("method", "path", "body", "where"),
    [
        ("POST", "/faults", b'{"latency": {"delay": "5ms"}', "line 1, column 29: "),
        ("POST", "/faults", b"latency:\n  delay: 5ms\n   bad: [1\n", "line 3, column 7: "),
        ("PATCH", "/faults/0", b'{"delay": ', "line 1, column 11: "),
    ],
)
def test_a_body_that_is_no_json_or_yaml_is_placed_at_its_line_and_column(
    method: str, path: str, body: bytes, where: str
) -> None:
    api = api_for()
    assert call(api, "POST", "/faults", {"latency": {"delay": "1ms"}})[0] == 201
    status, answer = call(api, method, path, body)
    assert status == 400
    assert answer["error"].startswith(f"the body must be a JSON or YAML mapping: {where}")
    assert "\n" not in answer["error"]


def test_the_control_404_lists_every_route_of_its_table_the_single_fault_get_too() -> None:
    status, answer = call(api_for(), "GET", "/nowhere")
    assert status == 404 and answer["error"] == "no route GET /nowhere"
    assert answer["routes"] == CONTROL_ROUTE_NAMES
    assert answer["routes"] == [str(route) for route, _ in CONTROL_ROUTES]


def test_a_listed_route_answers_every_method_it_lists_and_405_names_them_otherwise() -> None:
    api = api_for()
    assert call(api, "POST", "/faults", {"latency": {"delay": "1ms"}})[0] == 201
    assert call(api, "GET", "/faults/latency")[0] == 200
    assert call(api, "GET", "/faults/0")[1]["fault"] == "latency"
    status, answer = call(api, "POST", "/metrics")
    assert status == 405 and answer == {"error": "use GET on /metrics"}
    assert call(api, "PUT", "/faults")[1] == {"error": "use GET, POST or DELETE on /faults"}
    assert call(api, "POST", "/faults/0")[1] == {
        "error": "use GET, PATCH or DELETE on /faults/{index|name}"
    }


async def test_the_console_404_lists_the_consoles_routes_and_the_control_apis() -> None:
    async with console_running() as (_, _, ui_port):
        status, body, _ = await http(ui_port, "GET", "/nowhere")
        posted = await http(ui_port, "POST", "/api/stats")
    answer = json.loads(body)
    assert status == 404
    assert answer["routes"][:8] == [
        "GET /", "GET /index.html", "GET /feed", "GET /api/connections",
        "GET /api/streams/{id}", "GET /api/presets", "GET /api/drill", "GET /api/stats",
    ]  # fmt: skip
    assert answer["routes"][8:] == CONTROL_ROUTE_NAMES
    assert answer["routes"][:8] == [str(route) for route, _ in CONSOLE_ROUTES]
    assert posted[0] == 405 and json.loads(posted[1]) == {"error": "use GET on /api/stats"}


def test_the_control_apis_own_port_lists_no_console_route() -> None:
    answer = json.loads(ControlApi(api_for().proxy).route("GET", "/", {}, b"").body)
    assert "GET /api/stats" not in answer["routes"]
