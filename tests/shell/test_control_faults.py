"""One fault at a time on a live proxy: `/faults` lists the path with the options as a scenario
writes them, adds one where asked, merges a change into one, removes one, and refuses every
bad edit with the loader's own problems (the proxy untouched). A live proxy also refuses a
PUT whose `upstream:`/`workload:` it cannot apply, and every control answer carries its
reason phrase. Route-level tests call `ControlApi.route` directly (no sockets); the last
ones go through real sockets on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from middlebox.compose import PROXY_STAGES, load
from middlebox.library import scenario_dir
from middlebox.run.serve import LIBRARY_SCENARIOS, load_text
from middlebox.scenario.model import Scenario
from middlebox.shell.control import ControlApi, ControlledProxy, pass_through, reason_phrase
from middlebox.shell.fault_edits import scenario_document, written_options
from middlebox.shell.server import Address, ProxyConfig
from tests.shell.support import controlled

SCENARIOS = scenario_dir()


def api_for(scenario: Scenario | None = None) -> ControlApi:
    proxy = ControlledProxy(
        ProxyConfig(Address("127.0.0.1", 9), scenario or pass_through(), stages=PROXY_STAGES),
        loader=LIBRARY_SCENARIOS,
    )
    return ControlApi(proxy)


def call(api: ControlApi, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    response = api.route(method, path, {}, raw)
    return response.status, json.loads(response.body)


def names(api: ControlApi) -> list[str]:
    return [spec.name for spec in api.proxy.scenario.path]


def test_a_fault_posted_in_either_form_joins_the_path_where_asked() -> None:
    api = api_for()
    status, answer = call(api, "POST", "/faults", {"latency": {"delay": "300ms"}})
    assert status == 201 and answer["added"] == [0]
    status, answer = call(
        api,
        "POST",
        "/faults",
        {"fault": "cut", "options": {"after": "tokens", "count": 5}, "at": 0},
    )
    assert status == 201 and answer["added"] == [0]
    assert answer["faults"] == [
        {"index": 0, "fault": "cut", "options": {"after": "tokens", "count": 5}},
        {"index": 1, "fault": "latency", "options": {"delay": "300ms"}},
    ]
    assert names(api) == ["cut", "latency"]
    assert api.proxy.scenario.path[1].config["delay"] == pytest.approx(0.3)
    assert call(api, "GET", "/faults")[1]["faults"] == answer["faults"]


def test_a_posted_fault_may_be_yaml_and_a_preset_adds_all_of_its_faults() -> None:
    api = api_for()
    status, _ = call(api, "POST", "/faults", b"slicer: {size: 1}\n")
    assert status == 201 and names(api) == ["slicer"]
    status, answer = call(api, "POST", "/faults", {"preset": "nginx-default", "at": 0})
    # the control loader reads the presets as a scenario file does (compose.load_text)
    assert status == 201, answer
    assert names(api) == ["strip_header", "http10_upstream", "proxy_buffering", "idle_reaper",
                          "slicer"]  # fmt: skip
    assert len(answer["added"]) == 4


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"fault": "cutt", "options": {"count": 5}}, "did you mean 'cut'"),
        ({"latency": {"delay": 300}}, "write 300ms or 300s"),
        ({"latency": {"dealy": "1s"}}, "dealy"),
        ({"fault": "latency", "options": {}, "colour": 1}, "unknown keys ['colour']"),
        ({"latency": {}, "cut": {}}, "one fault per request"),
        ({"fault": "latency", "at": "first"}, "at: expected a position"),
        ({"fault": "latency", "at": 7}, "outside the path"),
        ([1, 2], "expected {"),
    ],
)
def test_a_bad_fault_is_refused_with_the_loaders_problem_and_the_path_is_untouched(
    body: Any, expected: str
) -> None:
    api = api_for()
    status, answer = call(api, "POST", "/faults", body)
    assert status == 400
    assert expected in json.dumps(answer)
    assert names(api) == []


def test_a_body_that_is_neither_json_nor_yaml_is_a_400_that_says_so() -> None:
    status, answer = call(api_for(), "POST", "/faults", b"{unclosed: [")
    assert status == 400 and "JSON or YAML mapping" in answer["error"]


def test_a_change_merges_into_the_faults_options_and_none_puts_an_option_back() -> None:
    api = api_for(load_text("name: x\npath:\n  - cut: {after: tokens, count: 5, end: rst}\n"))
    status, answer = call(api, "PATCH", "/faults/cut", {"count": 9})
    assert status == 200 and answer["changed"] == 0
    assert answer["faults"][0]["options"] == {"after": "tokens", "count": 9, "end": "rst"}
    status, answer = call(api, "PATCH", "/faults/0", {"options": {"end": None}})
    assert status == 200
    assert answer["faults"][0]["options"] == {"after": "tokens", "count": 9}


def test_a_bad_change_is_refused_and_the_fault_keeps_its_options() -> None:
    api = api_for(load_text("name: x\npath:\n  - latency: {delay: 5ms}\n"))
    status, answer = call(api, "PATCH", "/faults/0", {"delay": "soon"})
    assert status == 400 and "latency.delay" in answer["problems"][0]
    assert not answer["problems"][0].startswith("path[")  # no position in a made-up file
    assert api.proxy.scenario.path[0].config["delay"] == pytest.approx(0.005)
    assert call(api, "PATCH", "/faults/0", [1])[0] == 400


def test_faults_are_named_by_index_or_by_a_name_used_once() -> None:
    api = api_for(
        load_text("name: x\npath:\n  - latency: {delay: 5ms}\n  - latency: {delay: 9ms}\n")
    )
    status, answer = call(api, "PATCH", "/faults/latency", {"delay": "1ms"})
    assert status == 409 and "name one by index" in answer["error"]
    assert call(api, "DELETE", "/faults/cut")[0] == 404
    assert call(api, "DELETE", "/faults/2")[0] == 404
    status, answer = call(api, "GET", "/faults/-1")
    assert status == 200 and answer["options"] == {"delay": "9ms"}
    status, answer = call(api, "DELETE", "/faults/0")
    assert status == 200 and answer["removed"]["options"] == {"delay": "5ms"}
    assert [f["options"] for f in answer["faults"]] == [{"delay": "9ms"}]
    assert call(api, "POST", "/faults/0")[0] == 405
    assert call(api, "PUT", "/faults")[0] == 405
    assert call(api, "DELETE", "/faults")[1]["faults"] == []
    assert call(api, "DELETE", "/faults/0")[0] == 404  # nothing left to name


def test_untouched_faults_keep_their_cross_connection_state_and_an_edited_one_starts_fresh() -> (
    None
):
    api = api_for(load_text("name: x\npath:\n  - latency: {delay: 5ms}\n  - slicer: {size: 1}\n"))
    latency_state, slicer_state = api.proxy.shared
    latency_state["seen"] = slicer_state["seen"] = 3
    call(api, "POST", "/faults", {"cut": {"count": 2}, "at": 1})
    assert api.proxy.shared[0] is latency_state and api.proxy.shared[2] is slicer_state
    assert api.proxy.shared[1] == {}
    call(api, "PATCH", "/faults/latency", {"delay": "6ms"})
    assert api.proxy.shared[0] == {} and api.proxy.shared[2] is slicer_state
    call(api, "DELETE", "/faults/cut")
    assert api.proxy.shared[1] is slicer_state and len(api.proxy.shared) == 2


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenarios_faults_and_proxy_block_read_back_from_their_document(
    path: Path,
) -> None:
    scenario = load(path)
    back = load_text(json.dumps(scenario_document(scenario)), "<document>")
    assert [(s.name, dict(s.config)) for s in back.path] == [
        (s.name, dict(s.config)) for s in scenario.path
    ]
    assert back.proxy == scenario.proxy
    assert all(isinstance(written_options(spec), dict) for spec in scenario.path)


def test_durations_are_written_with_their_unit_and_nested_blocks_as_mappings() -> None:
    scenario = load_text(
        "name: x\npath:\n  - http_error: {status: 429, retry_after: 1500ms, match: {first: 2}}\n"
    )
    assert written_options(scenario.path[0]) == {
        "status": 429,
        "retry_after": "1.5s",
        "match": {"first": 2},
    }


def test_a_put_whose_upstream_or_workload_a_live_proxy_cannot_apply_is_refused_with_why() -> None:
    api = api_for()
    body = (SCENARIOS / "healthy-baseline.yaml").read_bytes()
    status, answer = call(api, "PUT", "/scenario", body)
    assert status == 400 and answer["error"] == "cannot apply this scenario live"
    assert [p.split(":")[0] for p in answer["problems"]] == ["upstream", "workload"]
    assert "?ignore=upstream" in answer["problems"][0]
    assert api.proxy.scenario.name == "pass-through"
    status, answer = call(api, "PUT", "/scenario?ignore=upstream,workload", body)
    assert status == 200 and api.proxy.scenario.name == "healthy-baseline"
    # the same blocks as the active scenario's: nothing to apply, nothing refused
    assert call(api, "PUT", "/scenario", body)[0] == 200
    status, answer = call(api, "PUT", "/scenario?ignore=workload", body.replace(b"15ms", b"9ms"))
    assert status == 400 and [p.split(":")[0] for p in answer["problems"]] == ["upstream"]


def test_the_scenario_document_is_a_body_put_takes_back() -> None:
    api = api_for(load(SCENARIOS / "abandon-through-nginx-default.yaml"))
    _, before = call(api, "GET", "/scenario")
    call(api, "DELETE", "/scenario")
    status, after = call(api, "PUT", "/scenario", before["document"])
    assert status == 200
    assert after["path"] == before["path"] and after["document"] == before["document"]


def test_every_status_the_api_answers_has_its_reason_phrase() -> None:
    assert reason_phrase(404) == "Not Found"
    assert reason_phrase(201) == "Created" and reason_phrase(409) == "Conflict"
    assert reason_phrase(599) == "Error"


async def test_status_lines_carry_the_reason_phrase_on_the_wire() -> None:
    with trio.fail_after(10):
        async with controlled() as run:
            for path, line in [
                ("/nowhere", b"HTTP/1.1 404 Not Found\r\n"),
                ("/faults", b"HTTP/1.1 200 OK\r\n"),
            ]:
                stream = await trio.open_tcp_stream("127.0.0.1", run.control_port)
                await stream.send_all(
                    f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
                )
                head = b""
                while b"\r\n" not in head:
                    data = await stream.receive_some(4096)
                    assert data
                    head += data
                await stream.aclose()
                assert head.startswith(line)


def test_a_fault_body_over_64_kib_is_refused_before_it_is_parsed() -> None:
    api = api_for()
    huge = json.dumps({"set_header": {"headers": {"x": "y" * 70_000}}}).encode()
    status, answer = call(api, "POST", "/faults", huge)
    assert status == 413 and "over 65536 bytes" in answer["error"]
    assert names(api) == []
