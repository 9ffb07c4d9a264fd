"""The Python API of a live proxy (middlebox.run.live): a ControlClient adds, changes and
removes one fault at a time, its context managers undo what they did however the block
ends, refusals arrive as ControlError with the API's problems, counters and journals read
back; scenarios are built in code with the loader's own validation. Real sockets on
127.0.0.1 against the control API of tests/shell/support.py (bounded in time)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import trio

from middlebox.compose import load
from middlebox.library import scenario_dir
from middlebox.run.live import (
    ControlClient,
    ControlError,
    control_banner,
    fault,
    http_transport,
    load_scenario,
    scenario,
    scenario_text,
)
from middlebox.scenario.convert import ScenarioError
from tests.shell.support import EVENTS, controlled, http

SCENARIOS = scenario_dir()


async def in_thread(function: Callable[[], Any]) -> Any:
    """The client is synchronous (a user's test or script): run it off the proxy's loop."""
    return await trio.to_thread.run_sync(function)


async def test_a_fault_added_for_a_block_fires_on_the_stream_and_is_gone_afterwards() -> None:
    with trio.fail_after(20):
        async with controlled() as run:
            control = ControlClient(f"http://127.0.0.1:{run.control_port}")
            seen: dict[str, Any] = {}

            async def stream() -> bytes:
                return (await http(run.proxy_port, "POST", "/v1/chat/completions", b"{}"))[1]

            def add() -> int:
                return control.add_fault("latency", delay="1ms")

            index = await in_thread(add)
            seen["faults"] = await in_thread(control.faults)
            assert EVENTS[1] in await stream()
            while run.proxy.active:
                await trio.sleep(0.01)
            seen["fired"] = await in_thread(control.fired)
            await in_thread(lambda: control.add_fault("slicer", size=1))
            seen["never"] = await in_thread(control.never_fired)
            await in_thread(lambda: control.remove_fault("slicer"))
            await in_thread(lambda: control.remove_fault(index))
            seen["after"] = await in_thread(control.faults)
            assert index == 0
            assert seen["faults"] == [{"index": 0, "fault": "latency", "options": {"delay": "1ms"}}]
            assert seen["fired"] == {"latency": 1}
            assert seen["never"] == ["slicer"]  # added after the stream: it saw none
            assert seen["after"] == []
            journals = await in_thread(control.journals)
            assert [j["faults_fired"] for j in journals] == [["latency"]]
            lines = await in_thread(lambda: control.journal(journals[0]["connection"]))
            assert any(line["type"] == "fault" for line in lines)
            counters = await in_thread(control.counters)
            assert counters["middlebox_connections_total"] == 1
            await in_thread(control.reset_counters)
            assert (await in_thread(control.counters))["middlebox_connections_total"] == 0


async def scripted(script: Callable[[ControlClient], list[Any]]) -> list[Any]:
    """What `script` saw, run with a client of a live proxy's control API (its address
    given without a scheme) off the proxy's loop."""
    with trio.fail_after(20):
        async with controlled() as run:
            control = ControlClient(f"127.0.0.1:{run.control_port}")
            return list(await in_thread(lambda: script(control)))


async def test_the_context_managers_undo_on_exit_even_when_the_block_raises() -> None:
    def script(control: ControlClient) -> list[Any]:
        seen: list[Any] = []
        control.add_fault("slicer", size=1)
        with pytest.raises(RuntimeError), control.fault("cut", at=0, count=3):
            seen.append([f["fault"] for f in control.faults()])
            raise RuntimeError("the test failed inside the block")
        seen.append([f["fault"] for f in control.faults()])
        with control.changed("slicer", size=2, max_size=4) as now:
            seen.append(now["options"])
        seen.append(control.faults()[0]["options"])
        with control.using({"name": "swapped", "path": [fault("latency", delay="2ms")]}):
            seen.append(control.active_scenario()["name"])
        seen.append(control.active_scenario()["document"]["path"])
        control.clear_faults()
        with control.using(load_text_scenario()):
            seen.append([f["fault"] for f in control.faults()])
        seen.append(control.active_scenario()["name"])
        return seen

    assert await scripted(script) == [
        ["cut", "slicer"],
        ["slicer"],
        {"size": 2, "max_size": 4},
        {"size": 1},
        "swapped",
        [{"slicer": {"size": 1}}],
        ["latency"],
        "pass-through",
    ]


def load_text_scenario() -> Any:
    return scenario("built-in-code", fault("latency", delay="3ms"))


async def test_a_refusal_is_a_control_error_with_the_apis_status_and_problems() -> None:
    with trio.fail_after(20):
        async with controlled(token="s3cret") as run:
            url = f"http://127.0.0.1:{run.control_port}"
            control = ControlClient(url, token="s3cret")

            def refusals() -> list[ControlError]:
                found = []
                for attempt in (
                    lambda: control.add_fault("cutt", count=3),
                    lambda: control.add_fault("latency", delay=300),
                    lambda: control.change_fault("latency", delay="1ms"),
                    lambda: control.set_scenario(SCENARIOS / "healthy-baseline.yaml"),
                    lambda: ControlClient(url).faults(),
                ):
                    with pytest.raises(ControlError) as caught:
                        attempt()
                    found.append(caught.value)
                return found

            unknown, bare, missing, live, unauthorised = await in_thread(refusals)
            assert unknown.status == 400 and "did you mean 'cut'" in unknown.problems[0]
            assert "write 300ms or 300s" in str(bare)
            assert missing.status == 404 and "no fault named 'latency'" in missing.error
            assert live.status == 400 and [p.split(":")[0] for p in live.problems] == [
                "upstream",
                "workload",
            ]
            assert unauthorised.status == 401

            def applied() -> str:
                return str(
                    control.set_scenario(
                        SCENARIOS / "healthy-baseline.yaml", ignore=("upstream", "workload")
                    )["name"]
                )

            assert await in_thread(applied) == "healthy-baseline"


def test_a_client_needs_an_http_url_and_a_plain_text_refusal_is_still_an_error() -> None:
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        http_transport("https://example.invalid:1")
    with pytest.raises(ValueError, match="URL"):
        ControlClient()
    client = ControlClient(transport=lambda method, path, body: (502, b"Bad Gateway\n"))
    with pytest.raises(ControlError, match="502: Bad Gateway"):
        client.faults()
    sent: list[tuple[str, str, bytes]] = []

    def recording(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        sent.append((method, path, body))
        return 200, b'{"faults": [], "changed": 0, "removed": {}}'

    ControlClient(transport=recording).remove_fault("a name/with slash")
    assert sent == [("DELETE", "/faults/a%20name%2Fwith%20slash", b"")]


def test_scenarios_are_built_from_dicts_objects_and_files_with_the_loaders_validation() -> None:
    built = scenario("two", fault("latency", delay="5ms"), fault("cut", count=4))
    assert [spec.name for spec in built.path] == ["latency", "cut"]
    assert built.path[0].config["delay"] == pytest.approx(0.005)
    with pytest.raises(ScenarioError, match="did you mean 'cut'"):
        scenario("typo", fault("cutt", count=4))
    with pytest.raises(ScenarioError, match="write 5ms or 5s"):
        load_scenario({"name": "bare", "path": [{"latency": {"delay": 5}}]})
    assert load_scenario(built) is built
    assert load_scenario("healthy-baseline.yaml", SCENARIOS).name == "healthy-baseline"
    assert json.loads(scenario_text(built))["path"] == [
        {"latency": {"delay": "5ms"}},
        {"cut": {"count": 4}},
    ]
    assert json.loads(scenario_text({"name": "d", "path": []})) == {"name": "d", "path": []}
    file_text = scenario_text(SCENARIOS / "healthy-baseline.yaml")
    assert file_text == (SCENARIOS / "healthy-baseline.yaml").read_text()
    assert load(SCENARIOS / "healthy-baseline.yaml").name in file_text


def test_the_proxy_banner_with_a_control_api_is_recognised_and_others_are_not() -> None:
    line = (
        "listening on http://127.0.0.1:4100 -> 127.0.0.1:8000 (scenario 'pass-through', "
        "0 faults); control API on http://127.0.0.1:4101\n"
    )
    assert control_banner(line) == line.strip()
    assert control_banner("listening on http://127.0.0.1:4100 -> 127.0.0.1:8000\n") is None
    assert control_banner("warning: upstream 127.0.0.1:8000 is not reachable now\n") is None


def test_a_block_removes_the_fault_it_added_even_after_others_were_added_before_it() -> None:
    api = api_for_test()
    control = ControlClient(transport=route_transport(api))
    with control.fault("latency", delay="1ms") as index:
        assert index == 0
        control.add_fault("slicer", at=0, size=1)  # the block's fault moves to index 1
        with control.changed("latency", delay="2ms"):
            control.add_fault("cut", at=0, count=3)  # and to index 2
        assert control.faults()[2]["options"] == {"delay": "1ms"}
    assert [f["fault"] for f in control.faults()] == ["cut", "slicer"]
    with pytest.raises(ControlError, match="block holds is gone"), control.fault("slicer", size=9):
        control.clear_faults()


async def test_a_block_removes_its_fault_after_the_block_changed_its_options() -> None:
    def script(control: ControlClient) -> list[Any]:
        seen: list[Any] = []
        with control.fault("latency", delay="300ms"):  # README's Python API example
            control.change_fault("latency", delay="1s")
        seen.append(control.faults())
        control.add_fault("latency", delay="5ms")
        with control.fault("latency", at=0, delay="300ms") as index:
            control.change_fault(index, delay="1s")
            control.add_fault("slicer", at=0, size=1)  # the block's fault: index 1
            control.change_fault(1, delay="2s")
            control.remove_fault("slicer")  # and back at index 0
            with control.changed(0, delay="3s"):
                control.change_fault(0, delay="4s")
            seen.append(control.faults())
        seen.append(control.faults())
        return seen

    after_one, inside, after_two = await scripted(script)
    assert after_one == []
    assert [f["options"] for f in inside] == [{"delay": "2s"}, {"delay": "5ms"}]
    assert after_two == [{"index": 0, "fault": "latency", "options": {"delay": "5ms"}}]


def test_a_block_whose_fault_this_client_removed_says_it_is_gone_and_removes_no_other() -> None:
    control = ControlClient(transport=route_transport(api_for_test()))
    control.add_fault("latency", delay="1ms")
    gone = pytest.raises(ControlError, match="latency fault this block holds is gone")
    with gone, control.fault("latency", delay="1ms"):
        control.remove_fault(1)
    assert control.faults() == [{"index": 0, "fault": "latency", "options": {"delay": "1ms"}}]


def api_for_test() -> Any:
    from middlebox.compose import PROXY_STAGES
    from middlebox.run.serve import LIBRARY_SCENARIOS
    from middlebox.shell.control import ControlApi, ControlledProxy, pass_through
    from middlebox.shell.server import Address, ProxyConfig

    proxy = ControlledProxy(
        ProxyConfig(Address("127.0.0.1", 9), pass_through(), stages=PROXY_STAGES),
        loader=LIBRARY_SCENARIOS,
    )
    return ControlApi(proxy)


def route_transport(api: Any) -> Callable[[str, str, bytes], tuple[int, bytes]]:
    def send(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        response = api.route(method, path, {}, body)
        return response.status, response.body

    return send
