"""The diagnosis line and symptom figures on results the scorecard tests do not reach
(report/diagnosis.py): the remaining verdicts, the two-symptom cap, malformed metrics."""

from __future__ import annotations

from typing import Any

import pytest

from middlebox.report.diagnosis import (
    EXPLAIN,
    UNKNOWN,
    description_fix,
    diagnose,
    failure_message,
    symptoms,
    why_and_fix,
)


def run_result(verdicts: list[str], **metrics: Any) -> dict[str, Any]:
    return {
        "requests": [{"verdict": v, "attempts": 1} for v in verdicts],
        "verdicts": {"requests": verdicts, "faults_fired": []},
        "metrics": {"client.bursts": 3, **metrics},
    }


@pytest.mark.parametrize(
    ("verdict", "opening", "metric"),
    [
        ("duplicated", "duplicated text: ", "client.duplicated"),
        ("missing_tokens", "tokens missing: ", "client.missing_tokens"),
        ("mojibake", "mojibake: ", "client.mojibake"),
    ],
)
def test_each_text_damage_verdict_names_its_own_why_and_fix(
    verdict: str, opening: str, metric: str
) -> None:
    line = diagnose(run_result([verdict]))
    assert line == f"{opening}{EXPLAIN[metric].why}; fix: {EXPLAIN[metric].fix}"


def test_only_the_two_worst_symptoms_are_named() -> None:
    line = diagnose(run_result(["hang", "silent_truncation", "mojibake"]))
    assert line.startswith("hung: ") and "; silent truncation: " in line
    assert "mojibake" not in line


def test_a_detected_cut_reads_as_said_by_the_client_with_the_resume_fix() -> None:
    line = diagnose(run_result(["complete", "truncation_detected"]))
    assert line == (
        "cut short, and the client said so: " + EXPLAIN["client.truncations_detected"].fix
    )


def test_a_reported_error_reads_as_failed_with_no_text_shown() -> None:
    assert diagnose(run_result(["error_reported"])) == (
        "failed, and the client said so (no text shown)"
    )


def test_a_worse_symptom_hides_the_detected_cut() -> None:
    line = diagnose(run_result(["truncation_detected", "duplicated"]))
    assert line.startswith("duplicated text: ") and "cut short" not in line


def test_abandoned_on_purpose_is_still_healthy_and_says_so() -> None:
    assert diagnose(run_result(["complete", "abandoned"])) == (
        "healthy: complete, abandoned on purpose"
    )


def test_a_run_with_no_requests_and_no_symptom_has_a_dash_for_a_diagnosis() -> None:
    assert diagnose({}) == "-"
    assert diagnose(run_result(["unknown_verdict"])) == "-"


def test_without_a_verdicts_block_the_request_verdicts_are_read() -> None:
    result = {"requests": [{"verdict": "hang"}], "metrics": {}}
    assert diagnose(result).startswith("hung: ")


def test_one_generation_per_request_is_not_amplification() -> None:
    assert "attempts for one request" not in diagnose(
        run_result(["complete"], **{"client.amplification": 1})
    )


def test_lumpiness_and_gap_are_not_measured_when_the_client_saw_no_bursts() -> None:
    found = symptoms(
        {
            "metrics": {
                "client.bursts": 0,
                "client.tokens_per_burst": 30.0,
                "client.largest_gap_ms": 900.0,
            }
        }
    )
    assert found.tokens_per_burst is None and found.largest_gap_ms is None
    # so a huge tokens-per-burst without bursts never reads as a buffering hop
    assert "lumps" not in diagnose(
        {
            "verdicts": {"requests": ["complete"]},
            "metrics": {"client.bursts": 0, "client.tokens_per_burst": 30.0},
        }
    )


def test_metrics_that_are_not_numbers_are_left_out_of_medians_and_maxima() -> None:
    found = symptoms(
        {
            "metrics": {
                "client.perceived_ttft_ms": [None, "x", 10, 30],
                "server.upstream_ttft_ms": "not measured",
                "server.abort_latency_ms": [None],
                "client.bursts": 2,
                "client.tokens_per_burst": "many",
            }
        }
    )
    assert found.perceived_ttft_ms == 20.0
    assert found.upstream_ttft_ms is None
    assert found.abort_latency_ms is None
    assert found.tokens_per_burst is None


def test_a_single_number_is_its_own_median_and_maximum() -> None:
    found = symptoms({"metrics": {"client.perceived_ttft_ms": 42, "server.abort_latency_ms": 7}})
    assert (found.perceived_ttft_ms, found.abort_latency_ms) == (42.0, 7.0)


def test_attempts_sum_over_requests_and_a_missing_count_is_zero() -> None:
    found = symptoms({"requests": [{"attempts": 3}, {}, {"attempts": None}]})
    assert (found.attempts, found.requests) == (3, 3)


def test_a_check_on_an_unexplained_metric_gets_the_generic_why_and_fix() -> None:
    check = {"name": "client.new_metric", "condition": "at_most", "expected": 1, "actual": 2}
    assert why_and_fix({}, "raw", check) == (UNKNOWN.why, UNKNOWN.fix)
    assert failure_message({}, "raw", check) == (
        f"client.new_metric at_most 1: got 2; why: {UNKNOWN.why}; fix: {UNKNOWN.fix}"
    )


@pytest.mark.parametrize(
    ("description", "sentence"),
    [
        ("It buffers. Fixes: proxy_buffering off. Then it streams.", "Fixes: proxy_buffering off."),
        ("FIX the client", "FIX the client"),
        ("The client is fixed by a read timeout", "The client is fixed by a read timeout"),
    ],
)
def test_the_fix_sentence_is_found_whatever_its_case_or_form(
    description: str, sentence: str
) -> None:
    assert description_fix(description) == sentence


def test_a_word_that_only_contains_fix_is_not_a_fix_sentence() -> None:
    assert description_fix("A prefix and a suffix, fixture aside.") is None


LUMPY = {"client.tokens_per_burst": 40.0, "server.tokens_per_burst": 1.0}


def test_a_hop_that_holds_the_whole_answer_gets_its_own_fix_not_nginxs() -> None:
    result = run_result(["complete"], **LUMPY)
    result["verdicts"]["faults_fired"] = ["buffer_whole_response"]
    line = diagnose(result)
    assert "lumps: a buffering hop (buffer_whole_response)" in line
    assert "server.stream-response-body = 2" in line and "proxy_buffering off" not in line


def test_nginxs_buffer_keeps_the_x_accel_buffering_fix() -> None:
    result = run_result(["complete"], **LUMPY)
    result["verdicts"]["faults_fired"] = ["proxy_buffering"]
    line = diagnose(result)
    assert "lumps: a buffering hop (proxy_buffering)" in line
    assert "X-Accel-Buffering: no or proxy_buffering off" in line
    assert "stream-response-body" not in line
