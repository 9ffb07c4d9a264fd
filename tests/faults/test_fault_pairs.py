"""Every registered fault composed with every other, both orders, on the virtual clock.

Each fault of `faults.REGISTRY`, once per `direction` where it has one, is paired with
each (itself too), in both orders, with fields drawn from the scenario schema
(tests/faults/drawn_configs.py), inside the proxy's own stages as `ProxyServer` builds a
connection's pipeline. Through it a client and a server that react to what reaches them
(tests/faults/conversation.py) play a plain request (`GET /v1/models`) and a streamed
answer (a vLLM chat completion), and every run must:

- finish: the connection ends as the relay ends it (both peers stopped sending, nothing
  held, no deadline left) within the horizon, with no deadline firing in a loop, unless
  a fault's report says the client is left in silence (a blackhole, a `hang`);
- end the way the reports say: the client gets a whole answer, or the end a report names
  (an RST, a FIN, or silence until it gives up), never a silence nobody reported;
- keep the bytes: in a direction no firing fault may change (`Fault.changes`), what
  arrives is a prefix of what was sent, all of it once the exchange completed; and with
  no report at all, both ways byte-exact with clean FINs.

Deterministic: the configs come from a `random.Random` seeded by the pair's names.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from faults import REGISTRY
from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import Fault, FaultReport
from middlebox.core.http1 import LAST_CHUNK_BYTES, Head, encode_chunk
from middlebox.core.stream import Direction
from middlebox.scenario.model import FaultSpec, Scenario
from middlebox.shell.server import Address, ProxyConfig, ProxyServer
from tests.faults.conversation import Exchange, Outcome, converse
from tests.faults.drawn_configs import drawn_entry, fault_fields, scenario_of

HORIZON = 30 * 86_400.0  # virtual seconds; the slowest drawn path takes a few hours
CONFIGS = 8  # drawn configs per fault variant
DRAWS = 2  # configs each ordered pair is run with (one of each side's per draw)

MODEL = "Qwen/Qwen3-0.6B"
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    separators=(",", ":"),
).encode()
STREAM_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: upstream\r\nContent-Type: application/json\r\n"
    b"Accept: text/event-stream\r\nAccept-Encoding: gzip\r\nCache-Control: no-cache\r\n"
    b"Content-Length: %d\r\n\r\n" % len(BODY)
) + BODY
PLAIN_REQUEST = (
    b"GET /v1/models HTTP/1.1\r\nHost: upstream\r\nAccept: application/json\r\n"
    b"Cache-Control: no-cache\r\n\r\n"
)
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    text = json.dumps({**event, "choices": [choice]}, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + text.encode() + b"\n\n"


# vLLM 0.33's frames (docs/emulator.md): the role, eight tokens with a two-byte character,
# the finish_reason, [DONE]
FRAMES = [
    _chunk({"role": "assistant", "content": ""}),
    *(_chunk({"content": f"tok{i}\u00e9 "}) for i in range(8)),
    _chunk({}, "stop"),
    b"data: [DONE]\n\n",
]
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 07:02:39 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\nx-accel-buffering: no\r\n"
)


def stream_answer(head: Head) -> list[bytes]:
    """uvicorn's answer: chunked, one frame a chunk; to HTTP/1.0 close-delimited."""
    if head.version == "HTTP/1.0":
        return [SSE_HEAD + b"connection: close\r\n\r\n", *FRAMES]
    head = SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n"
    return [head, *map(encode_chunk, FRAMES), LAST_CHUNK_BYTES]


def plain_answer(head: Head) -> list[bytes]:
    close = b"connection: close\r\n" if head.version == "HTTP/1.0" else b""
    length = b"content-length: %d\r\n" % len(MODELS)
    return [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + length + close + b"\r\n"
            + MODELS]  # fmt: skip


EXCHANGES = [
    Exchange("plain", PLAIN_REQUEST, "GET", plain_answer),
    Exchange("streamed", STREAM_REQUEST, "POST", stream_answer),
]

Variant = tuple[str, dict[str, Any] | None]


def variants() -> list[Variant]:
    """Each registered fault, once per `direction` value where it has that field."""
    found: list[Variant] = []
    for name, props in fault_fields().items():
        directions = props.get("direction", {}).get("enum")
        found += [(name, {"direction": d}) for d in directions] if directions else [(name, None)]
    return found


def label(variant: Variant) -> str:
    name, fixed = variant
    return f"{name}[{fixed['direction']}]" if fixed else name


VARIANTS = variants()
_SPECS: dict[str, list[FaultSpec]] = {}


def specs(variant: Variant) -> list[FaultSpec]:
    """CONFIGS drawn configs of one variant, each validated by the loader."""
    key = label(variant)
    if key not in _SPECS:
        rng = random.Random(key)
        _SPECS[key] = [
            scenario_of([drawn_entry(variant[0], rng, variant[1])]).path[0] for _ in range(CONFIGS)
        ]
    return _SPECS[key]


# The words of a report (its action, or the value of a field that says how something
# ended) that name the end the client then sees.
END_WORDS = {
    "rst": "rst",
    "reset": "rst",
    "gave_up": "rst",  # handoff: tcp_retries2 ran out, an RST both ways
    "fin": "fin",
    "close": "fin",
    "truncated_chunked": "fin",
    "hang": "silence",
    "blackhole": "silence",
    "silent": "silence",
}
END_FIELDS = ("end", "client", "outcome", "then")


def said_ends(reports: list[FaultReport]) -> set[str]:
    """The client ends the reports account for: a whole answer always, and each end a
    report names; a cut toward the server leaves the client whatever the upstream
    connection does next (cut.py: "sees whatever end the upstream connection has")."""
    ends = {"complete"}
    for report in reports:
        words = [report.action, *(report.details.get(key) for key in END_FIELDS)]
        ends.update(
            END_WORDS[word] for word in words if isinstance(word, str) and word in END_WORDS
        )
        if report.details.get("toward") == "server":
            ends.update(("fin", "rst", "silence"))
    return ends


def client_end(outcome: Outcome) -> str:
    if outcome.complete:
        return "complete"
    if outcome.timed_out or outcome.client_end is None:
        return "silence"
    return outcome.client_end


def problems(outcome: Outcome, faults: list[Fault]) -> list[str]:
    """What this run did that no report accounts for (empty: all as the reports say)."""
    reports = [report for fault in faults for report in fault.reports]
    ends = said_ends(reports)
    found: list[str] = []
    if outcome.stuck_at is not None:
        found.append(f"a deadline fired in a loop at t={outcome.stuck_at}")
    elif not outcome.finished and "silence" not in ends:
        found.append("the connection never finished (a hang)")
    end = client_end(outcome)
    if end not in ends:
        found.append(f"the client saw {end}, the reports say {sorted(ends)}")
    fired = [fault for fault in faults if fault.reports]
    for direction, sent, got, whole in (
        (Direction.UPSTREAM, outcome.request_sent, outcome.server_got, outcome.server_requests),
        (Direction.DOWNSTREAM, bytes(outcome.answer_sent), outcome.client_got, outcome.complete),
    ):
        if any(direction in fault.changes() for fault in fired):
            continue
        if not sent.startswith(got) or (whole and got != sent):
            found.append(
                f"{direction.name} bytes changed with no changing fault firing: {bytes(got)!r}"
            )
    if not reports and not (
        outcome.complete and outcome.client_end == "fin" and outcome.server_end == "fin"
    ):
        found.append("nothing fired, yet the exchange did not complete with clean FINs")
    return found


def test_the_variants_are_every_registered_fault_and_each_direction() -> None:
    assert {name for name, _ in VARIANTS} == set(REGISTRY)
    assert ("set_header", {"direction": "request"}) in VARIANTS
    assert ("latency", {"direction": "upstream"}) in VARIANTS


@pytest.mark.parametrize("first", VARIANTS, ids=label)
def test_every_pair_with_this_fault_ends_as_its_reports_say(first: Variant) -> None:
    failures: list[str] = []
    for index, second in enumerate(VARIANTS):
        rng = random.Random(f"{label(first)}+{label(second)}")
        for pair in [(first, second), (second, first)] * DRAWS:
            path = tuple(rng.choice(specs(variant)) for variant in pair)
            scenario = Scenario(name="pair", seed=index, path=path)
            for exchange in EXCHANGES:
                config = ProxyConfig(Address("127.0.0.1", 9), scenario, stages=PROXY_STAGES)
                server = ProxyServer(config)
                pipeline = server.make_pipeline(scenario, 0)
                faults = list(pipeline.faults)  # finished stages leave the pipeline
                outcome = converse(pipeline, exchange, HORIZON)
                for problem in problems(outcome, faults):
                    configs = [{spec.name: dict(spec.config)} for spec in path]
                    failures.append(f"{exchange.name} through {configs}: {problem}")
    assert not failures, f"{len(failures)} runs:\n" + "\n".join(failures[:12])
