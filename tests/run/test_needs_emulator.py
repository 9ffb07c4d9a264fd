"""`--upstream`: what only the emulator can do is reported, not run; a real server's
workload keeps the scenario's stream duration, and its bounds on tokens generated for
nobody are judged in decoding time (suite.needs_emulator, suite.paced,
suite.in_decoding_time)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from xml.etree import ElementTree

import trio

from middlebox.compose import expand_paths, load
from middlebox.library import scenario_dir
from middlebox.report.diagnosis import failure_message
from middlebox.report.scorecard import junit_xml, scorecard
from middlebox.run.outcome import SuiteOutcome
from middlebox.run.score import Check, evaluate_expect
from middlebox.run.suite import (
    IMITATION_FIELDS,
    WHY_EMULATOR,
    in_decoding_time,
    needs_emulator,
    paced,
    run_scenario,
    watches_the_leave,
)
from middlebox.scenario.workload import Workload
from vllm_emulator.config import EmulatorConfig

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name for f in dataclasses.fields(EmulatorConfig)}


def library() -> dict[str, str | None]:
    return {path.stem: needs_emulator(load(path)) for path in expand_paths([scenario_dir()])}


def test_the_library_scenarios_that_need_the_emulator_say_why() -> None:
    needing = {name: why for name, why in library().items() if why}
    assert sorted(needing) == [
        "abandon-no-abort",
        "idle-timeout-during-pause",
        "idle-timeout-with-heartbeats",
        "reasoning-behind-idle-timeout",
        "reasoning-with-heartbeats",
        "vllm-engine-error",
        "wifi-to-lte-resume",
    ]
    assert needing["reasoning-behind-idle-timeout"].endswith(
        "upstream.reasoning_tokens: a reasoning phase (the tier's model has no reasoning parser)"
    )
    assert needing["idle-timeout-with-heartbeats"] == (
        "upstream.pauses: a stall after N tokens (a real vLLM cannot be told to pause); "
        "upstream.sse_keep_alive_interval: SSE heartbeats (vLLM sends no keep-alive comments)"
    )
    assert "upstream.resumable" in needing["wifi-to-lte-resume"]


def test_the_list_is_derived_from_the_config_fields_so_a_new_field_needs_the_emulator() -> None:
    # the named fields exist (a rename cannot silently drop one)
    assert IMITATION_FIELDS <= FIELDS and set(WHY_EMULATOR) <= FIELDS
    scenario = load(scenario_dir() / "healthy-baseline.yaml")
    assert needs_emulator(scenario) is None  # itl and prefill_overhead tune the imitation

    @dataclasses.dataclass(frozen=True)
    class WithANewSwitch(EmulatorConfig):
        brand_new_behaviour: bool = False

    block = WithANewSwitch(itl=0.015, brand_new_behaviour=True)
    changed = dataclasses.replace(scenario, sections={**scenario.sections, "upstream": block})
    assert needs_emulator(changed) == "upstream.brand_new_behaviour: emulator behaviour"
    # a behaviour field at vLLM's default asks for nothing
    assert needs_emulator(dataclasses.replace(
        scenario, sections={**scenario.sections, "upstream": EmulatorConfig(resumable=False)}
    )) is None  # fmt: skip


def test_a_scenario_needing_the_emulator_is_neither_run_nor_failed(tmp_path: Path) -> None:
    scenario = load(scenario_dir() / "vllm-engine-error.yaml")
    # nothing listens at the discard port: a run would be a problem, not a skip
    outcome = trio.run(
        lambda: run_scenario(scenario, [], seed=None, upstream_url="http://127.0.0.1:9",
                             workdir=tmp_path)
    )  # fmt: skip
    assert outcome.passed and not outcome.scores and not outcome.problems
    assert outcome.needs_emulator == "upstream.fail_after_tokens: an in-band error after N " \
        "tokens (a real vLLM fails on its own)"  # fmt: skip
    document = SuiteOutcome([outcome], None, ["raw"]).document()
    (shown,) = document["scenarios"]
    assert shown["needs_emulator"] == outcome.needs_emulator
    assert shown["status"] == "needs the emulator" and document["passed"]
    assert f"vllm-engine-error: needs the emulator: {outcome.needs_emulator}" in scorecard(
        document, colour=False
    )
    (skipped,) = ElementTree.fromstring(junit_xml(document)).iter("skipped")
    assert skipped.get("message") == f"needs the emulator: {outcome.needs_emulator}"


def test_a_real_server_faster_than_the_scenario_gets_a_stream_as_long_in_time() -> None:
    scenario = load(scenario_dir() / "abandon-through-nginx-default.yaml")  # itl 10 ms
    workload = Workload(requests=1, max_tokens=120)
    assert paced(workload, scenario, 0.004).max_tokens == 300  # 120 x 10 ms at 4 ms each
    assert paced(workload, scenario, 0.02).max_tokens == 120  # slower: never fewer tokens
    assert paced(workload, scenario, None).max_tokens == 120  # speed unknown
    assert paced(workload, scenario, 0.00001).max_tokens == 4000  # bounded


def test_an_abandoning_stream_against_a_real_server_outlasts_a_slow_client() -> None:
    # the client leaves after 20 tokens: the stream lasts ABANDON_MARGIN (5 s) longer
    # than the scenario's, so a client that starts reading late still leaves mid-stream
    scenario = load(scenario_dir() / "abandon-through-nginx-default.yaml")  # itl 10 ms
    for abandoning in (
        Workload(requests=1, max_tokens=120, abandon_after_tokens=20),
        Workload(requests=1, max_tokens=120, abandon_after_seconds=0.5),
    ):
        # 120 x 10 ms = 1.2 s, + 5 s = 6.2 s: 1550 tokens at 4 ms
        assert paced(abandoning, scenario, 0.004).max_tokens == 1550
        # a slower server: 120 x 20 ms = 2.4 s, + 5 s = 7.4 s at 20 ms: 370 tokens
        assert paced(abandoning, scenario, 0.02).max_tokens == 370
        assert paced(abandoning, scenario, None).max_tokens == 120  # no real server speed
        assert paced(abandoning, scenario, 0.0001).max_tokens == 4000  # bounded
        kept = paced(abandoning, scenario, 0.004)
        assert kept.abandon_after_tokens == abandoning.abandon_after_tokens
    longer = Workload(requests=1, max_tokens=5000, abandon_after_tokens=20)
    assert paced(longer, scenario, 0.004).max_tokens == 5000  # never fewer


def test_a_hop_that_holds_the_whole_answer_gets_no_abandon_margin() -> None:
    # nginx-gzip expects no abort and bounds no waste: its point is the silence until the
    # end, which 5 s more would stretch past httpx's 5 s read timeout (it did: 6.2 s)
    held = load(scenario_dir() / "abandon-through-nginx-gzip.yaml")  # itl 10 ms
    watched = load(scenario_dir() / "abandon-through-nginx-default.yaml")
    assert not watches_the_leave(held) and watches_the_leave(watched)
    assert watches_the_leave(load(scenario_dir() / "abandon-ignore-client-close.yaml"))
    abandoning = Workload(requests=1, max_tokens=120, abandon_after_tokens=20)
    # 120 x 10 ms = 1.2 s + HOLD_MARGIN 1 s = 2.2 s: 550 tokens at 4 ms (not 6.2 s: 1550)
    assert paced(abandoning, held, 0.004).max_tokens == 550
    assert paced(abandoning, watched, 0.004).max_tokens == 1550


def test_a_bound_on_wasted_tokens_is_judged_in_the_real_servers_decoding_time() -> None:
    scenario = load(scenario_dir() / "abandon-direct.yaml")  # itl 15 ms, wasted max 3
    expect = {"server.tokens_wasted": {"max": 3}, "client.abandoned": 1}
    metrics = {"server.tokens_wasted": 14, "client.abandoned": 1}
    as_written = evaluate_expect(expect, "raw", metrics, ["raw"])
    assert [c.passed for c in as_written] == [False, True]
    # at 3 ms a token, 3 tokens of 15 ms are 45 ms of decoding: 15 tokens
    judged = in_decoding_time(as_written, scenario, 3.0)
    wasted, abandoned = judged
    assert wasted.passed and wasted.actual == 14 and wasted.expected == 3  # reported as measured
    assert "45 ms = 15.0 tokens at the server's 3 ms, or 3 as written" in wasted.note
    assert wasted.note.endswith("when that is the looser + the step in flight")
    assert abandoned == as_written[1]  # other names as written
    # 17 tokens is more than 45 ms and the step decoding when the client left: fails
    (edge, _) = in_decoding_time(
        evaluate_expect(expect, "raw", {**metrics, "server.tokens_wasted": 16}, ["raw"]),
        scenario,
        3.0,
    )
    assert edge.passed  # 15 tokens' time and the step in flight
    (over, _) = in_decoding_time(
        evaluate_expect(expect, "raw", {**metrics, "server.tokens_wasted": 17}, ["raw"]),
        scenario,
        3.0,
    )
    assert not over.passed and over.describe().endswith(
        "as written when that is the looser + the step in flight)"
    )
    line = failure_message({"name": "abandon-direct", "description": ""}, "raw", vars(over))
    assert line.startswith("server.tokens_wasted max 3: got 17 (judged in decoding time")
    # a slower server than the scenario: fewer tokens fill the same time, but a hop that
    # waits for frames (a failed write) still costs the tokens as written: the looser
    (slow, _) = in_decoding_time(as_written, scenario, 30.0)
    assert not slow.passed and "1.5 tokens" in slow.note  # 14 > max(1.5, 3) + 1
    (two_frames, _) = in_decoding_time(
        evaluate_expect(expect, "raw", {**metrics, "server.tokens_wasted": 4}, ["raw"]),
        scenario,
        30.0,
    )
    assert two_frames.passed  # 4 <= 3 as written + the step in flight, not 1.5 + 1
    (five, _) = in_decoding_time(
        evaluate_expect(expect, "raw", {**metrics, "server.tokens_wasted": 5}, ["raw"]),
        scenario,
        30.0,
    )
    assert not five.passed
    # a minimum scales the same way (tokens the server went on generating for nobody)
    (floor,) = in_decoding_time(
        [Check("server.tokens_wasted", "min", 200, 150, False)], scenario, 3.0
    )
    assert not floor.passed  # short of 200 as written and of 200 x 15 ms = 1000 tokens at 3 ms
    (floor_as_written,) = in_decoding_time(
        [Check("server.tokens_wasted", "min", 200, 700, True)], scenario, 3.0
    )
    assert floor_as_written.passed  # 700 < 1000 in time, but 200 as written is met
    # and a minimum on a slower server: the looser is the time's fewer tokens
    (slow_floor,) = in_decoding_time(
        [Check("server.tokens_wasted", "min", 200, 160, False)], scenario, 20.0
    )
    assert slow_floor.passed  # 3 s at 20 ms = 150 tokens; 160 falls short of 200 as written
    (short_floor,) = in_decoding_time(
        [Check("server.tokens_wasted", "min", 200, 100, False)], scenario, 20.0
    )
    assert not short_floor.passed  # 100 < 150
    # unknown speed or an exact count: as written
    assert in_decoding_time(as_written, scenario, None) == as_written
    exact = [Check("server.tokens_wasted", "equals", 0, 0, True)]
    assert in_decoding_time(exact, scenario, 3.0) == exact
