"""`--upstream` against a real vLLM: what the suite asks it for and how it judges what it
sent (suite.real_body_extra, suite.paced with merged frames, upstream.pace,
suite.at_server_lumpiness, suite.sampled_ms_per_token)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from middlebox.compose import load
from middlebox.library import scenario_dir
from middlebox.run.score import DELIVERED_TOKENS_PER_BURST, Check, evaluate_expect
from middlebox.run.suite import (
    FRAME_MARGIN,
    REAL_BODY_EXTRA,
    SERVER_CHUNKS_PER_BURST,
    SERVER_TOKENS_PER_BURST,
    arrivals,
    at_server_lumpiness,
    paced,
    real_body_extra,
    sampled_ms_per_token,
)
from middlebox.run.upstream import PACE_TOKENS, Pace, UpstreamClient, pace
from middlebox.scenario.workload import Workload
from tests.run.http_stub import QuietHandler, stub_upstream

ROOT = Path(__file__).resolve().parents[2]
EMAIL = [{"type": "function", "function": {"name": "send_email", "parameters": {}}}]


def test_a_plain_request_asks_for_exactly_max_tokens_but_a_structured_one_does_not() -> None:
    assert real_body_extra(Workload()) == REAL_BODY_EXTRA == {"ignore_eos": True}
    # guided decoding closes a call or a JSON answer, then only EOS may follow: with
    # ignore_eos vLLM pads it to max_tokens and ends `length`, a cut no client should run
    assert real_body_extra(Workload(tools=EMAIL)) == {}
    assert real_body_extra(Workload(tools=EMAIL, tool_choice="required")) == {}
    assert real_body_extra(Workload(response_format={"type": "json_object"})) == {}
    extra = real_body_extra(Workload())
    extra["x"] = 1
    assert REAL_BODY_EXTRA == {"ignore_eos": True}  # a copy each time


def test_a_server_merging_tokens_into_frames_gets_the_scenarios_frames_worth() -> None:
    scenario = load(scenario_dir() / "clean-close-without-done.yaml")  # itl 15 ms
    workload = Workload(requests=1, max_tokens=40)
    # seen: 40 tokens in 14 frames; a cut after 12 token-bearing events needs 12 frames
    merged = paced(workload, scenario, 0.010, 40 / 14)
    assert merged.max_tokens == 172  # ceil(40 x 2.86 x 1.5), more than 40 x 15 ms / 10 ms
    assert FRAME_MARGIN == 1.5
    # one token a frame: paced in time only, as before
    assert paced(workload, scenario, 0.010, 1.0).max_tokens == 60
    assert paced(workload, scenario, 0.010).max_tokens == 60
    # a slow server merging a little: the frames decide, never fewer than asked
    assert paced(workload, scenario, 0.030, 1.2).max_tokens == 72
    assert paced(workload, scenario, 0.030, 1.0).max_tokens == 40
    assert paced(workload, scenario, 0.00001, 3.0).max_tokens == 4000  # bounded


class Streaming(QuietHandler):
    """48 tokens in 16 frames of three, then the usage chunk and [DONE], as a vLLM whose
    API server lags its engine sends them."""

    bodies: list[dict[str, object]] = []

    def do_POST(self) -> None:
        Streaming.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        frames = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        frames += [{"choices": [{"index": 0, "delta": {"content": "abc"}}]} for _ in range(16)]
        frames.append({"choices": [], "usage": {"completion_tokens": PACE_TOKENS}})
        body = b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames)
        body += b"data: [DONE]\n\n"
        self.answer(body, "text/event-stream")


@pytest.fixture
def streaming() -> Iterator[UpstreamClient]:
    Streaming.bodies = []
    with stub_upstream(Streaming) as client:
        yield client


def test_the_pace_is_per_token_and_says_how_many_tokens_a_frame_carried(
    streaming: UpstreamClient,
) -> None:
    measured = pace(streaming, "m")
    assert isinstance(measured, Pace)
    assert measured.tokens_per_frame == 3.0  # 48 tokens (the usage chunk) in 16 frames
    assert 0 < measured.seconds_per_token < 1.0
    [body] = Streaming.bodies
    assert body["ignore_eos"] is True and body["max_tokens"] == PACE_TOKENS
    assert body["stream_options"] == {"include_usage": True}


def test_an_unreachable_server_has_no_pace() -> None:
    assert pace(UpstreamClient("http://127.0.0.1:9"), "m") is None


def test_arrivals_group_frames_within_ten_ms_as_the_clients_bursts_are() -> None:
    assert arrivals([]) == []
    assert arrivals([1.0, 1.004, 1.009, 1.03, 1.2, 1.205]) == [1.0, 1.03, 1.2]
    assert arrivals([1.2, 1.0]) == [1.0, 1.2]  # sorted first


def test_a_max_on_tokens_per_burst_is_judged_against_the_servers_own_lumps() -> None:
    expect = {"client.tokens_per_burst": {"max": 2}, "client.bursts": {"min": 1}}
    metrics = {"client.tokens_per_burst": 5.3, "client.bursts": 20, SERVER_TOKENS_PER_BURST: 3.1}
    written = evaluate_expect(expect, "raw", metrics, ["raw"])
    assert [c.passed for c in written] == [False, True]
    lumps, bursts = at_server_lumpiness(written, metrics)
    assert lumps.passed and lumps.actual == 5.3 and lumps.expected == 2  # as measured
    assert "it sent 3.10 tokens per burst to the proxy, so max 2 = 6.20" in lumps.note
    assert bursts == written[1]
    # a hop that lumped beyond twice the server's own still fails
    (over, _) = at_server_lumpiness(
        evaluate_expect(expect, "raw", {**metrics, "client.tokens_per_burst": 6.3}, ["raw"]),
        {**metrics, "client.tokens_per_burst": 6.3},
    )
    assert not over.passed
    # a client that read in bigger lumps than the path delivered to its socket lumped them
    # itself (its process starved by a CPU-bound vLLM): judged at the socket, with a note
    lagging = {
        **metrics, "client.tokens_per_burst": 161.0, DELIVERED_TOKENS_PER_BURST: 5.0,
        SERVER_CHUNKS_PER_BURST: 3.0,
    }  # fmt: skip
    (late, _) = at_server_lumpiness(evaluate_expect(expect, "raw", lagging, ["raw"]), lagging)
    assert late.passed and "the client's own process read them later" in late.note
    # a path that delivered lumps beyond twice the server's chunks still fails, and says so
    lumped = {**lagging, DELIVERED_TOKENS_PER_BURST: 6.5}
    (hop, _) = at_server_lumpiness(evaluate_expect(expect, "raw", lumped, ["raw"]), lumped)
    assert not hop.passed and "beyond the bound: a hop lumped them" in hop.note
    # without the client leg's delivery (an HTTP/2 or content-coded leg) the client's view
    unseen = {k: v for k, v in lagging.items() if k != DELIVERED_TOKENS_PER_BURST}
    (blind, _) = at_server_lumpiness(evaluate_expect(expect, "raw", unseen, ["raw"]), unseen)
    assert not blind.passed
    # a server that sent one token a burst (the emulator's shape): as written
    smooth = {**metrics, SERVER_TOKENS_PER_BURST: 1.0}
    assert at_server_lumpiness(written, smooth) == written
    assert at_server_lumpiness(written, {"client.tokens_per_burst": 5.3}) == written
    # a min (a buffering hop shown) is not converted
    floor = [Check("client.tokens_per_burst", "min", 4, 5.0, True)]
    assert at_server_lumpiness(floor, metrics) == floor


def test_the_decoding_pace_is_the_counters_rise_while_the_clients_request_ran() -> None:
    samples = [
        (0.0, 0.0, 100.0),  # idle before
        (1.0, 1.0, 110.0),
        (1.2, 1.0, 130.0),
        (1.5, 1.0, 160.0),  # 50 tokens in 0.5 s since 1.0 s: 10 ms a token
        (2.0, 1.0, 200.0),  # after the client left
        (3.0, 0.0, 200.0),  # idle after
    ]
    assert sampled_ms_per_token(samples, until=1.6) == 10.0
    # without `until` the last running sample counts: 90 tokens over 1.0 s
    assert sampled_ms_per_token(samples, until=None) == round(1000 / 90, 2)
    # fewer than two running samples, or no rise: unknown
    assert sampled_ms_per_token(samples, until=1.1) is None
    assert sampled_ms_per_token([(1.0, 1.0, 5.0), (2.0, 1.0, 5.0)], None) is None
    assert sampled_ms_per_token([], None) is None
