"""Every diagnosis appears where its cause is and nowhere else (report/diagnosis.py).

A catalogue holds, per diagnosis, one run (as the report document holds it) that has its
cause; each diagnosis must be named for its own run and for no other run of the
catalogue. Then the near misses: the runs a careless rule would misdiagnose (lumps with
no buffering fault in the path, a late first token with no slow hop, a few tokens in
flight when the client left, one attempt)."""

from __future__ import annotations

from typing import Any

import pytest

from middlebox.report.diagnosis import diagnose, findings
from middlebox.report.scorecard import SEVERITY


def run(
    verdicts: list[str] | None = None,
    fired: list[str] | None = None,
    attempts: int = 1,
    refused: int | None = None,
    **metrics: Any,
) -> dict[str, Any]:
    verdicts = verdicts if verdicts is not None else ["complete"]
    return {
        "client": "raw",
        "passed": True,
        "requests": [
            {
                "verdict": v,
                "attempts": attempts,
                "upstream_status": refused if v == "upstream_error" else None,
            }
            for v in verdicts
        ],
        "verdicts": {"requests": verdicts, "faults_fired": fired or [], "checks": {}},
        "metrics": {"client.bursts": 10, "client.tokens_per_burst": 1.0, **metrics},
        "checks": [],
        "faults_declared": [],
    }


# diagnosis -> (the words that name it, a run with its cause)
CATALOGUE: dict[str, tuple[str, dict[str, Any]]] = {
    "upstream error": ("the upstream answered HTTP 501: ", run(["upstream_error"], refused=501)),
    "hung": ("hung: ", run(["hang"])),
    "no result": ("no result: ", run(["no_result"])),
    "silent truncation": ("silent truncation: ", run(["silent_truncation"])),
    "mojibake": ("mojibake: ", run(["mojibake"])),
    "duplicated text": ("duplicated text: ", run(["duplicated"])),
    "answer redrawn": ("answer redrawn: ", run(["contradicted"])),
    "tokens missing": ("tokens missing: ", run(["missing_tokens"])),
    "acted on partial call": ("acted on partial call: ", run(["acted_on_partial_call"])),
    "side effect repeated": ("side effect repeated: ", run(["side_effect_repeated"])),
    "acted on invalid json": ("acted on invalid json: ", run(["acted_on_invalid_json"])),
    "reasoning as answer": ("reasoning as answer: ", run(["reasoning_as_answer"])),
    "reasoning hidden": ("reasoning hidden: ", run(["reasoning_hidden"])),
    "amplification": (
        "attempts for one request",
        run(attempts=3, **{"client.amplification": 3, "server.generations_per_request": 3}),
    ),
    "resumed": (
        "cut, and resumed 1 time: one generation",
        run(
            attempts=2,
            **{
                "client.amplification": 2,
                "client.resumed": 1,
                "server.generations_per_request": 1,
            },
        ),
    ),
    "buffering hop": (
        "a buffering hop",
        run(fired=["proxy_buffering:released"], **{"client.tokens_per_burst": 15.0}),
    ),
    "slow hop": (
        "a slow hop",
        run(
            fired=["latency:delaying"],
            **{"client.perceived_ttft_ms": [500.0], "server.upstream_ttft_ms": [60.0]},
        ),
    ),
    "wasted": (
        "tokens generated for nobody",
        run(["abandoned"], **{"server.tokens_wasted": 280}),
    ),
    "wasted after the path ended the stream": (
        "tokens generated after the path ended the stream (cut)",
        run(["truncation_detected"], fired=["cut:cut"], **{"server.tokens_wasted": 32}),
    ),
    "wasted by a background response": (
        "a background response left running: 280 tokens for nobody",
        run(["abandoned"], **{"server.tokens_wasted": 280, "server.background_left_running": 1}),
    ),
    "cut short": ("cut short, and the client said so", run(["truncation_detected"])),
    "failed": ("failed, and the client said so", run(["error_reported"])),
    "whole answer then error": ("whole answer, then an error: ", run(["complete_then_error"])),
    "healthy": ("healthy: ", run(["complete", "abandoned"])),
}


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_each_diagnosis_is_named_for_its_cause_and_for_no_other_run(name: str) -> None:
    words, cause = CATALOGUE[name]
    assert words in diagnose(cause), diagnose(cause)
    elsewhere = [other for other, (_, case) in CATALOGUE.items() if other != name]
    named_in = [other for other in elsewhere if words in diagnose(CATALOGUE[other][1])]
    assert named_in == [], f"{name!r} also named for {named_in}"


def test_every_verdict_the_scorecard_knows_has_a_case_in_the_catalogue() -> None:
    """A new verdict must join the catalogue, and so get its must-not-appear cases."""
    covered = {v for _, case in CATALOGUE.values() for v in case["verdicts"]["requests"]}
    assert set(SEVERITY) - covered == set()
    # and each names something: no verdict alone leaves the diagnosis empty
    assert all(findings(run([verdict])) for verdict in SEVERITY)


# ------------------------------------------------------------------ near misses


@pytest.mark.parametrize(
    ("why", "case"),
    [
        (
            "an upstream at 5 ms a token makes one burst of the whole answer itself",
            run(**{"client.tokens_per_burst": 32.0, "server.tokens_per_burst": 300.0}),
        ),
        (
            "a handoff's outage releases what it held together: not a buffering hop",
            run(fired=["handoff:released"], **{"client.tokens_per_burst": 8.6}),
        ),
        (
            "a slow reader's socket fills and is read at once: not a buffering hop",
            run(fired=["slow_reader:paused"], **{"client.tokens_per_burst": 12.0}),
        ),
        (
            "without a buffering fault a loaded machine merges up to ~5 flushes",
            run(**{"client.tokens_per_burst": 5.0}),
        ),
        (
            "with a buffering fault, under 3 times the upstream's own bursts is not lumpy",
            run(
                fired=["proxy_buffering:released"],
                **{"client.tokens_per_burst": 5.5, "server.tokens_per_burst": 1.9},
            ),
        ),
        (
            "a client that holds a retried answer back lumps what the path delivered smooth",
            run(
                ["complete"],
                attempts=2,
                **{"client.tokens_per_burst": 52.0, "client.delivered_tokens_per_burst": 1.1},
            ),
        ),
        (
            "no bursts seen: nothing measured",
            run(**{"client.bursts": 0, "client.tokens_per_burst": 30.0}),
        ),
    ],
)
def test_lumps_that_no_hop_buffered_are_not_a_buffering_hop(why: str, case: dict[str, Any]) -> None:
    assert "buffering" not in diagnose(case) and "lumps" not in diagnose(case), why


@pytest.mark.parametrize(
    ("case", "hop"),
    [
        (run(**{"client.tokens_per_burst": 9.0}), "a buffering hop;"),  # outside the path
        (run(fired=["coalescer:held"], **{"client.tokens_per_burst": 4.2}), "(coalescer)"),
        (
            # the path's lumps, where the journal saw them, whatever the client made of them
            run(
                fired=["proxy_buffering:released"],
                **{"client.tokens_per_burst": 1.5, "client.delivered_tokens_per_burst": 15.0},
            ),
            "~15-token (~4 KiB) lumps: a buffering hop (proxy_buffering)",
        ),
        (
            run(
                fired=["gzip_encoding:flushed", "handoff:released"],
                **{"client.tokens_per_burst": 120.0, "server.tokens_per_burst": 1.9},
            ),
            "(gzip_encoding)",
        ),
    ],
)
def test_lumps_a_hop_buffered_are_named_with_the_hop(case: dict[str, Any], hop: str) -> None:
    assert "lumps: a buffering hop" in diagnose(case) and hop in diagnose(case)


def test_a_late_first_text_is_a_slow_hop_only_with_a_delaying_fault_and_one_attempt() -> None:
    late = {"client.perceived_ttft_ms": [500.0], "server.upstream_ttft_ms": [60.0]}
    assert "a slow hop" not in diagnose(run(**late))  # the client's own start
    assert "a slow hop" not in diagnose(run(fired=["latency:delaying"], attempts=2, **late))
    close = {"client.perceived_ttft_ms": [150.0], "server.upstream_ttft_ms": [60.0]}
    assert "a slow hop" not in diagnose(run(fired=["latency:delaying"], **close))  # < 100 ms


def test_a_few_tokens_in_flight_when_the_client_left_are_not_waste_worth_naming() -> None:
    assert "nobody" not in diagnose(run(["abandoned"], **{"server.tokens_wasted": 3}))
    assert "nobody" in diagnose(run(["abandoned"], **{"server.tokens_wasted": 4}))


def test_a_resume_of_the_one_generation_is_not_amplification_but_a_restart_is() -> None:
    resumed = {"client.amplification": 2, "client.resumed": 1}
    one = diagnose(run(attempts=2, **resumed, **{"server.generations_per_request": 1}))
    assert "attempts for one request" not in one and one.startswith("cut, and resumed")
    # a client that resumed once but still ran the model twice (it restarted as well)
    two = diagnose(run(attempts=2, **resumed, **{"server.generations_per_request": 2}))
    assert "2 attempts for one request (the model ran 2)" in two and "resumed" not in two
    # the generations unknown: the attempts may each have run the model
    unknown = diagnose(run(attempts=2, **resumed))
    assert "attempts for one request (each may re-run the model)" in unknown
    # a resumed run whose text is damaged is named for the damage, not as resumed
    assert "resumed" not in diagnose(
        run(["duplicated"], attempts=2, **resumed, **{"server.generations_per_request": 1})
    )


def test_a_background_response_left_running_is_told_to_cancel_not_to_propagate_a_close() -> None:
    left = diagnose(
        run(["abandoned"], **{"server.tokens_wasted": 280, "server.background_left_running": 1})
    )
    assert "POST /v1/responses/{id}/cancel" in left and "proxy_ignore_client_abort" not in left
    # waste with no background response left running is the close that never reached it
    closed = diagnose(run(["abandoned"], **{"server.tokens_wasted": 280}))
    assert "proxy_ignore_client_abort" in closed and "cancel" not in closed


def test_one_attempt_per_request_is_not_amplification() -> None:
    assert "attempts for one request" not in diagnose(run(**{"client.amplification": 1}))


def test_the_mild_diagnoses_give_way_to_any_symptom() -> None:
    for mild in (["truncation_detected"], ["error_reported"], ["complete_then_error"]):
        line = diagnose(run([*mild, "silent_truncation"]))
        assert line.startswith("silent truncation: ")
        assert "said so" not in line and "then an error" not in line
    assert "healthy" not in diagnose(run(["complete"], **{"server.tokens_wasted": 40}))
    assert "healthy" not in diagnose(run(["complete", "truncation_detected"]))


def test_the_upstreams_error_names_its_status_and_goes_before_what_the_client_showed() -> None:
    mixed = run(["upstream_error", "silent_truncation", "upstream_error"], refused=503)
    assert diagnose(mixed).startswith("the upstream answered HTTP 503: the server itself refused")
    assert "silent truncation" in diagnose(mixed)
    # a client's error after a fault's answer (http_error) blames no upstream
    assert "upstream" not in diagnose(run(["error_reported"]))


CLIENT_CLOSE_BLAMED = "its close never reached the model"


def test_waste_after_the_path_ended_the_stream_names_the_path_not_a_client_close() -> None:
    """A fault ended the client's stream and the upstream went on (a cut toward the client
    only): the client never left, so no close of its failed to reach the model."""
    said = diagnose(run(["silent_truncation"], fired=["cut:cut"], **{"server.tokens_wasted": 32}))
    assert said.startswith("silent truncation: ")
    assert "32 tokens generated after the path ended the stream (cut)" in said
    assert "closes its upstream connection too" in said
    assert CLIENT_CLOSE_BLAMED not in said and "tokens generated for nobody" not in said


@pytest.mark.parametrize(
    ("why", "fired", "verdicts"),
    [
        ("the client gave up on purpose", ["cut:cut"], ["abandoned"]),
        ("the client vanished", ["cut:cut", "client_vanish:vanished"], ["silent_truncation"]),
        ("the path swallowed the client's close", ["ignore_client_close:ignored"], ["complete"]),
        ("no fault ended the stream", [], ["silent_truncation"]),
    ],
)
def test_waste_after_the_client_left_blames_its_close(
    why: str, fired: list[str], verdicts: list[str]
) -> None:
    said = diagnose(run(verdicts, fired=fired, **{"server.tokens_wasted": 40}))
    assert "40 tokens generated for nobody" in said and CLIENT_CLOSE_BLAMED in said, why
    assert "after the path ended the stream" not in said, why


def test_waste_after_an_inband_error_is_a_close_that_never_reached_the_model() -> None:
    """inband_error is not a stream-ending fault: its `then: done` closes the upstream leg
    itself (no waste), so waste beside it is a client that gave up on the error (`then:
    continue`) and whose close never reached the model, not the path's doing."""
    said = diagnose(
        run(["abandoned"], fired=["inband_error:injected"], **{"server.tokens_wasted": 40})
    )
    assert "40 tokens generated for nobody" in said and CLIENT_CLOSE_BLAMED in said
    assert "after the path ended the stream" not in said


def attempts_explained(**metrics: Any) -> str:
    """What the scorecard says once under its table of a run's extra attempts."""
    (found,) = [f for f in findings(run(attempts=3, **metrics)) if "attempts" in f.name]
    return f"{found.text} / {found.key}"


def test_attempts_a_hop_answered_are_not_said_to_re_run_the_model() -> None:
    """rate-limit-storm: two 429s with Retry-After, then one generation. The extra attempts
    never reached the model, so the scorecard must not say that retries re-ran it."""
    hop_answered = attempts_explained(
        **{"client.amplification": 3, "server.generations_per_request": 1}
    )
    assert "3 attempts for one request (the model ran 1)" in hop_answered
    assert "answered by a hop" in hop_answered and "honour Retry-After" in hop_answered
    assert "re-ran the model" not in hop_answered
    restarted = attempts_explained(
        **{"client.amplification": 3, "server.generations_per_request": 3}
    )
    assert "re-ran the model" in restarted and "answered by a hop" not in restarted
    assert "answered by a hop" not in attempts_explained(**{"client.amplification": 3})
