"""Background responses on the real vLLM 0.32 and on the emulator: resume, cancel, retrieve.

The same sequence of requests goes to both (the tier's vLLM runs with
VLLM_ENABLE_RESPONSES_API_STORE=1, the emulator with `responses_store: true`) and each step's
answer is compared masked, as test_conformance.py compares single requests:

- a background stream whose client leaves after event 10 goes on; `GET
  /v1/responses/{id}?stream=true&starting_after=10` writes 11.. to `response.completed`, and
  the text read before and after the disconnect is the stored response's whole text;
- a resume with `starting_after` at the last event (`response.completed`) gets the 200 and
  its headers, then no byte: vLLM's reader waits for an event after the last one;
- a cancel of a running background response answers it `cancelled`; a reader that follows it
  gets the events made before the cancel and then nothing (no `response.completed`);
- a second cancel, or a cancel of a finished response, is a 400;
- a foreground Responses or Messages stream stops generating when its client leaves (as chat),
  a background one does not (judged by `vllm:generation_tokens_total` on both).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from realvllm.serve import Server
from tests.real_vllm import wirecompare
from tests.real_vllm.cases import MAX_MODEL_LEN, response
from tests.real_vllm.conftest import Emulator
from tests.real_vllm.test_conformance import _unexplained
from tests.real_vllm.test_conformance import emulator as emulator  # the module's fixture
from tests.real_vllm.wirecompare import Exchange

IDLE = 3.0  # seconds without a byte that count as "waits" (vLLM answers in milliseconds)


@dataclass
class Read:
    exchange: Exchange
    ended: bool  # the response ended (chunked terminator)
    idle: bool  # no byte came for IDLE seconds
    broken: bool = False  # the server dropped the connection mid-response


def read_stream(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    until: Callable[[bytes], bool] = lambda _: False,
    idle: float = IDLE,
) -> Read:
    """One request, read until `until(body)`, the end, or `idle` seconds without a byte."""
    host, port = wirecompare._host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        assert conn.sock is not None
        conn.sock.settimeout(idle)
        data = b""
        ended = timed_out = broken = False
        while not until(data):
            try:
                chunk = resp.read1(65536)
            except TimeoutError:
                timed_out = True
                break
            except http.client.IncompleteRead as error:
                data += error.partial
                broken = True
                break
            if not chunk:
                ended = True
                break
            data += chunk
        status = f"HTTP/1.1 {resp.status} {resp.reason}"
        head = tuple((k.lower(), v) for k, v in resp.getheaders())
        return Read(Exchange(status, head, data), ended, timed_out, broken)
    finally:
        conn.close()


def has_sequence(number: int) -> Callable[[bytes], bool]:
    """Event `number` has come whole (its blank line too: a read may end inside it)."""
    marker = f'"sequence_number":{number},'.encode()

    def came(data: bytes) -> bool:
        at = data.find(marker)
        return at >= 0 and data.find(b"\n\n", at) >= 0

    return came


def events(data: bytes) -> list[dict[str, Any]]:
    """The whole events in `data` (a read stopped by `until` may end inside the next one,
    which does not parse)."""
    return [value for value in wirecompare.frame_values(data) if isinstance(value, dict)]


def stored(url: str, response_id: str, wait_for_end: bool = True) -> dict[str, Any]:
    """GET /v1/responses/{id}; with wait_for_end, until it is no longer `queued`."""
    deadline = time.monotonic() + 120
    while True:
        got = wirecompare.fetch(url, "GET", f"/v1/responses/{response_id}")
        answer: dict[str, Any] = json.loads(got.body)
        if not wait_for_end or answer.get("status") != "queued":
            return answer
        assert time.monotonic() < deadline, f"{url}: {response_id} still queued after 120 s"
        time.sleep(0.2)


def _compare(case: str, real: Exchange, emulated: Exchange) -> None:
    assert _unexplained(case, wirecompare.compare(real, emulated, case)) == []


def test_a_background_stream_goes_on_after_its_client_leaves_and_resumes_after_event_n(
    vllm_server: Server, emulator: Emulator
) -> None:
    resumed: list[Read] = []
    for url in (vllm_server.url, emulator.url):
        request = response(max_output_tokens=400, stream=True, background=True)
        first = read_stream(url, "POST", "/v1/responses", request, until=has_sequence(10))
        seen = [e for e in events(first.exchange.body) if e["sequence_number"] <= 10]
        assert not first.ended and [e["sequence_number"] for e in seen] == list(range(11))
        response_id = seen[0]["response"]["id"]
        again = read_stream(
            url, "GET", f"/v1/responses/{response_id}?stream=true&starting_after=10"
        )
        assert again.ended, (url, again.exchange.body[-300:])
        later = events(again.exchange.body)
        numbers = [e["sequence_number"] for e in later]
        assert numbers == list(range(11, 11 + len(numbers))), (url, numbers[:20])
        assert later[-1]["type"] == "response.completed"
        # Every piece of text once: what came before the disconnect and after the resume.
        text = "".join(e["delta"] for e in seen + later if e["type"].endswith("text.delta"))
        whole = stored(url, response_id)
        assert whole["status"] == "incomplete" and whole["usage"]["output_tokens"] == 400
        assert text == whole["output"][0]["content"][0]["text"]
        resumed.append(again)
    _compare("responses-background-resume-after-10", resumed[0].exchange, resumed[1].exchange)
    # The emulator's ledger: the generation went on after the client left, nobody cancelled.
    (entry,) = [e for e in emulator_ledger(emulator) if e["background"] and e["resumes"] == 1]
    assert entry["endpoint"] == "responses" and entry["disconnected_at"] is not None
    assert entry["aborted_at"] is None and entry["cancelled_at"] is None
    assert entry["completion_tokens"] == 400 and entry["finish_reason"] == "length"


def emulator_ledger(emulator: Emulator) -> list[dict[str, Any]]:
    body = wirecompare.fetch(emulator.url, "GET", "/emulator/requests").body
    entries: list[dict[str, Any]] = json.loads(body)["requests"]
    return entries


def test_a_resume_at_the_last_event_gets_the_headers_and_then_waits_as_on_vllm(
    vllm_server: Server, emulator: Emulator
) -> None:
    answers: list[Read] = []
    for url in (vllm_server.url, emulator.url):
        request = response(stream=True, background=True)
        whole = read_stream(url, "POST", "/v1/responses", request)
        assert whole.ended
        last = events(whole.exchange.body)[-1]
        assert last["type"] == "response.completed"
        response_id, number = last["response"]["id"], last["sequence_number"]
        path = f"/v1/responses/{response_id}?stream=true&starting_after={number}"
        at_last = read_stream(url, "GET", path)
        assert at_last.idle and not at_last.ended and at_last.exchange.body == b"", url
        assert at_last.exchange.status_line == "HTTP/1.1 200 OK"
        # One before the last: the last event, then the end.
        before = read_stream(url, "GET", path.replace(f"={number}", f"={number - 1}"))
        assert before.ended and [e["type"] for e in events(before.exchange.body)] == [
            "response.completed"
        ]
        answers.append(at_last)
    _compare("responses-resume-at-last-event", answers[0].exchange, answers[1].exchange)


def test_a_cancelled_background_response_is_cancelled_and_its_readers_wait_as_on_vllm(
    vllm_server: Server, emulator: Emulator
) -> None:
    steps: dict[str, list[Exchange]] = {}
    long = MAX_MODEL_LEN - 64  # long enough that the cancel lands while it runs
    for url in (vllm_server.url, emulator.url):
        request = response(max_output_tokens=long, stream=True, background=True)
        host, port = wirecompare._host_port(url)
        conn = http.client.HTTPConnection(host, port, timeout=60)
        conn.request("POST", "/v1/responses", json.dumps(request).encode(),
                     {"Content-Type": "application/json"})  # fmt: skip
        live = conn.getresponse()
        data = b""
        while b'"sequence_number":1,' not in data:
            data += live.read1(65536)
        response_id = events(data)[0]["response"]["id"]
        cancel = wirecompare.fetch(url, "POST", f"/v1/responses/{response_id}/cancel")
        assert cancel.status_line == "HTTP/1.1 200 OK", (url, cancel.body)
        assert json.loads(cancel.body)["status"] == "cancelled"
        conn.close()
        after = wirecompare.fetch(url, "GET", f"/v1/responses/{response_id}")
        assert json.loads(after.body)["status"] == "cancelled"
        follow = read_stream(
            url, "GET", f"/v1/responses/{response_id}?stream=true&starting_after=1"
        )
        kinds = [e["type"] for e in events(follow.exchange.body)]
        assert follow.idle and not follow.ended and "response.completed" not in kinds, kinds[-3:]
        again = wirecompare.fetch(url, "POST", f"/v1/responses/{response_id}/cancel")
        assert again.status_line == "HTTP/1.1 400 Bad Request"
        steps.setdefault("cancel", []).append(cancel)
        steps.setdefault("retrieve-cancelled", []).append(after)
        steps.setdefault("cancel-again", []).append(again)
    for step, (real, emulated) in steps.items():
        _compare(f"responses-{step}", real, emulated)
    (entry,) = [e for e in emulator_ledger(emulator) if e["cancelled_at"] is not None]
    assert entry["aborted_at"] is not None and entry["finish_reason"] == "abort"
    assert entry["completion_tokens"] < long


def test_retrieving_stored_responses_answers_as_vllm_does(
    vllm_server: Server, emulator: Emulator
) -> None:
    steps: dict[str, list[Exchange]] = {}
    for url in (vllm_server.url, emulator.url):
        # A foreground response is stored when it ends; a cancel of it is refused.
        post = wirecompare.fetch_sampled(url, "POST", "/v1/responses", response())
        response_id = json.loads(post.body)["id"]
        got = wirecompare.fetch(url, "GET", f"/v1/responses/{response_id}")
        assert json.loads(got.body)["output"] == json.loads(post.body)["output"]
        steps.setdefault("retrieve-foreground", []).append(got)
        refused = wirecompare.fetch(url, "POST", f"/v1/responses/{response_id}/cancel")
        steps.setdefault("cancel-finished", []).append(refused)
        # A background response without a stream: queued, then the whole answer; it has no
        # event store, so a streamed GET gets its headers and then a dropped connection.
        queued = wirecompare.fetch(url, "POST", "/v1/responses", response(background=True))
        assert json.loads(queued.body)["status"] == "queued"
        steps.setdefault("background-queued", []).append(queued)
        background_id = json.loads(queued.body)["id"]
        assert stored(url, background_id)["status"] == "incomplete"
        dropped = read_stream(url, "GET", f"/v1/responses/{background_id}?stream=true")
        assert dropped.exchange.body == b"" and not dropped.idle and not dropped.ended, url
        steps.setdefault("stream-without-event-store", []).append(dropped.exchange)
    for step, (real, emulated) in steps.items():
        _compare(f"responses-{step}", real, emulated)


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_the_ledger_records_each_api_like_chat(emulator: Emulator, api: str) -> None:
    # Runs against the emulator only: what the scorer reads for these APIs.
    path = f"/v1/{api}"
    body = (response if api == "responses" else _message)(stream=True)
    read = read_stream(emulator.url, "POST", path, body)
    assert read.ended
    entry = emulator_ledger(emulator)[-1]
    assert entry["endpoint"] == api and entry["stream"] is True
    assert entry["completion_tokens"] == 4 and entry["finish_reason"] == "length"
    assert entry["bytes_written"] == len(read.exchange.body)


def _message(**fields: Any) -> dict[str, Any]:
    from tests.real_vllm.cases import message

    return message(**fields)


def generated(url: str) -> float:
    """vllm:generation_tokens_total, which both servers count as tokens are made."""
    text = wirecompare.fetch(url, "GET", "/metrics").body.decode()
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:generation_tokens_total in /metrics")


def leave_after_three_events(url: str, path: str, body: dict[str, Any]) -> str:
    """Open a stream, read three events, close the connection; the first event's JSON."""
    host, port = wirecompare._host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body).encode(),
                     {"Content-Type": "application/json"})  # fmt: skip
        live = conn.getresponse()
        data = b""
        while data.count(b"data: ") < 3:
            data += live.read1(300)
        return data.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode()
    finally:
        conn.close()


def test_a_foreground_stream_of_each_api_stops_when_its_client_leaves_a_background_one_not(
    vllm_server: Server, emulator: Emulator
) -> None:
    # Judged the same way on both servers: the generation counter stops, or goes on to the
    # whole answer (vLLM aborts a foreground request on disconnect and runs a background one
    # as a task of its own; measured 2026-12-04: 4 tokens, and 1691 then 3284 of 8000).
    many = 4000
    for url in (vllm_server.url, emulator.url):
        for path, body in (
            ("/v1/responses", response(max_output_tokens=many, stream=True)),
            ("/v1/messages", _message(max_tokens=many, stream=True)),
        ):
            before = generated(url)
            leave_after_three_events(url, path, body)
            time.sleep(1.0)
            settled = generated(url)
            time.sleep(1.5)
            assert generated(url) == settled, (url, path, "still generating")
            assert settled - before < many, (url, path, "made the whole answer")
        before = generated(url)
        first = json.loads(
            leave_after_three_events(
                url, "/v1/responses", response(max_output_tokens=many, stream=True, background=True)
            )
        )
        whole = stored(url, first["response"]["id"])
        assert whole["usage"]["output_tokens"] == many
        assert generated(url) - before >= many, url
    entries = emulator_ledger(emulator)[-3:]
    assert [e["endpoint"] for e in entries] == ["responses", "messages", "responses"]
    assert [e["aborted_at"] is not None for e in entries] == [True, True, False]
    assert all(e["disconnected_at"] is not None for e in entries)
