"""The control API: scenarios loaded, replaced and cleared at runtime, Prometheus
metrics, journals, counter resets, the bearer token, and per-connection scenarios
chosen with X-Middlebox-Scenario (real sockets on 127.0.0.1, bounded in time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from middlebox.observe.prometheus import parse_text
from middlebox.shell.control import check_control_access
from middlebox.shell.server import Address
from tests.shell.support import EVENTS, controlled, http

LATENCY = "name: slow\npath:\n  - latency: {delay: 1ms}\n"


async def test_a_scenario_put_through_the_api_applies_to_the_next_stream_and_shows_in_metrics() -> (
    None
):
    # real time: the PUT's scenario is parsed in a child process, whose wait a MockClock
    # would jump past to the test's deadline
    with trio.fail_after(10):
        async with controlled() as run:
            status, body, _ = await http(run.control_port, "PUT", "/scenario", LATENCY.encode())
            assert status == 200 and json.loads(body)["path"][0]["fault"] == "latency"
            status, body, _ = await http(run.proxy_port, "POST", "/v1/chat/completions", b"{}")
            assert status == 200 and EVENTS[1] in body
            with trio.move_on_after(2):
                while run.proxy.active:
                    await trio.sleep(0.01)
            status, text, _ = await http(run.control_port, "GET", "/metrics")
            samples = parse_text(text.decode())
            assert samples["middlebox_connections_total"] == 1
            assert samples['middlebox_faults_fired_total{fault="latency",action="delaying"}'] >= 1
            assert samples['middlebox_fault_connections_total{fault="latency"}'] == 1
            assert (
                samples['middlebox_bytes_total{leg="client",direction="downstream",op="wrote"}']
                == samples['middlebox_bytes_total{leg="upstream",direction="downstream",op="read"}']
                > 0
            )
            assert samples["middlebox_journal_dropped_total"] == 0
            assert samples['middlebox_scenario_info{name="slow",faults="1"}'] == 1

            status, body, _ = await http(run.control_port, "GET", "/journals")
            journals = json.loads(body)["journals"]
            assert [j["connection"] for j in journals] == [1]
            assert journals[0]["faults_fired"] == ["latency"]
            status, body, _ = await http(run.control_port, "GET", "/journals/1")
            lines = [json.loads(line) for line in body.decode().splitlines()]
            events = [x for x in lines if x["type"] == "sse_event" and x["leg"] == "client"]
            assert [e["done"] for e in events] == [False, True]
            assert (await http(run.control_port, "GET", "/journals/9"))[0] == 404

            status, body, _ = await http(run.control_port, "DELETE", "/scenario")
            assert json.loads(body)["name"] == "pass-through"
            await http(run.control_port, "POST", "/counters/reset")
            samples = parse_text((await http(run.control_port, "GET", "/metrics"))[1].decode())
            assert samples["middlebox_connections_total"] == 0
            assert not any(name.startswith("middlebox_faults_fired_total{") for name in samples)
            assert json.loads((await http(run.control_port, "GET", "/journals"))[1]) == {
                "journals": [],
                "evicted": 0,
            }


async def test_an_invalid_scenario_is_refused_with_every_problem_and_the_old_one_stays() -> None:
    with trio.fail_after(10):
        async with controlled() as run:
            bad = b"name: bad\npath:\n  - latencyy: {}\n  - latency: {delay: -1}\n"
            status, body, _ = await http(run.control_port, "PUT", "/scenario", bad)
            assert status == 400
            problems = json.loads(body)["problems"]
            assert len(problems) == 2 and "latencyy" in problems[0]
            assert run.proxy.scenario.name == "pass-through"


async def test_with_a_token_every_request_needs_the_bearer() -> None:
    with trio.fail_after(10):
        async with controlled(token="s3cret") as run:
            assert (await http(run.control_port, "GET", "/metrics"))[0] == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await http(run.control_port, "GET", "/metrics", headers=wrong))[0] == 401
            right = {"Authorization": "Bearer s3cret"}
            assert (await http(run.control_port, "GET", "/metrics", headers=right))[0] == 200


def test_the_control_api_refuses_a_non_loopback_address_without_a_token() -> None:
    with pytest.raises(ValueError, match="needs a token"):
        check_control_access(Address("0.0.0.0", 9001), None)
    check_control_access(Address("0.0.0.0", 9001), "t")
    check_control_access(Address("::1", 9001), None)
    check_control_access(Address("localhost", 9001), None)


async def test_a_connection_picks_its_scenario_with_the_request_header(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    (tmp_path / "slow.yaml").write_text(LATENCY)
    with trio.fail_after(10):
        async with controlled(scenario_dir=tmp_path) as run:
            _, body, _ = await http(run.control_port, "GET", "/scenarios")
            assert json.loads(body)["available"] == ["slow"]
            plain = await http(run.proxy_port, "POST", "/v1/x", b"{}")
            chosen = await http(
                run.proxy_port, "POST", "/v1/x", b"{}", {"X-Middlebox-Scenario": "slow"}
            )
            assert plain[0] == chosen[0] == 200 and plain[1] == chosen[1]  # byte-exact
            unknown = await http(
                run.proxy_port, "POST", "/v1/x", b"{}", {"X-Middlebox-Scenario": "../etc"}
            )
            assert unknown[0] == 400 and b"unknown scenario" in unknown[1]
            with trio.move_on_after(2):
                while run.proxy.active:
                    await trio.sleep(0.01)
            journals = run.proxy.store.journals
            assert journals[1].scenario == "pass-through" and not journals[1].faults
            assert journals[2].scenario == "slow" and journals[2].faults
            assert run.proxy.metrics.scenario_header == {"slow": 1}


async def test_a_header_timeout_is_journaled_as_how_the_client_side_ended(
    autojump_clock: MockClock,
) -> None:
    from middlebox.run.serve import load_text
    from tests.harness import read_all

    with trio.fail_after(10):
        async with controlled() as run:
            run.proxy.set_scenario(load_text("name: t\nproxy: {client_header_timeout: 100ms}\n"))
            stream = await trio.open_tcp_stream("127.0.0.1", run.proxy_port)
            await stream.send_all(b"POST /v1/x HTTP/1.1\r\nHost: x\r\n")  # never finished
            _, ended = await read_all(stream)
            assert ended == "fin"  # closed unanswered, as nginx does
            with trio.move_on_after(2):
                while run.proxy.active:
                    await trio.sleep(0.01)
            summary = run.proxy.store.journals[1].summary()
            assert {"leg": "client", "direction": "upstream", "kind": "header_timeout"} in summary[
                "ends"
            ]


@pytest.mark.parametrize("token", [" ", "\t", "two words", "secret\n"])
def test_a_token_with_whitespace_is_refused_before_anything_binds(token: str) -> None:
    # a blank token passed for one and opened 0.0.0.0; no client could send it either
    for host in ("0.0.0.0", "127.0.0.1"):
        with pytest.raises(ValueError, match="has whitespace in it"):
            check_control_access(Address(host, 9001), token)
    check_control_access(Address("0.0.0.0", 9001), "s3cr3t-token_~+/=")
