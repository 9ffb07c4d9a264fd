"""Edges of the Prometheus text reader (observe/prometheus.py) that vLLM's and the control
API's `/metrics` pages can present: lines the reader must skip, not misread."""

from __future__ import annotations

import math

import pytest

from middlebox.observe.prometheus import parse_text, totals


@pytest.mark.parametrize(
    "line",
    [
        'broken{label="x" 1',  # opening brace never closed
        "name_without_value",
        'labels_without_value{a="b"}',
        "name not_a_number",
        'series{a="b"} twelve',
    ],
)
def test_an_unreadable_sample_line_is_skipped_not_guessed(line: str) -> None:
    assert parse_text(f"{line}\ngood 2\n") == {"good": 2.0}


def test_comments_and_blank_lines_are_not_samples() -> None:
    text = "# HELP up whether up\n# TYPE up gauge\n\n   \nup 1\n"
    assert parse_text(text) == {"up": 1.0}


def test_a_sample_indented_by_whitespace_is_still_read() -> None:
    assert parse_text('   up{job="a"} 3\t\n') == {'up{job="a"}': 3.0}


def test_a_brace_inside_the_value_part_does_not_start_labels() -> None:
    # the brace comes after the first space: the series is the bare name
    assert parse_text("plain 4 {not labels}\n") == {"plain": 4.0}


def test_a_closing_brace_inside_a_label_value_keeps_the_whole_label_set() -> None:
    samples = parse_text('m{path="/a}b",code="200"} 5\n')
    assert samples == {'m{path="/a}b",code="200"}': 5.0}


def test_infinities_and_nan_are_read_as_floats() -> None:
    samples = parse_text("a +Inf\nb -Inf\nc NaN\n")
    assert samples["a"] == math.inf and samples["b"] == -math.inf and math.isnan(samples["c"])


def test_a_repeated_series_keeps_its_last_value() -> None:
    assert parse_text("up 1\nup 0\n") == {"up": 0.0}


def test_totals_keep_unlabelled_and_labelled_metrics_apart_by_name() -> None:
    text = 'x{a="1"} 2\nx{a="2"} 3\nx_total 10\ny 1\n'
    assert totals(text) == {"x": 5.0, "x_total": 10.0, "y": 1.0}


def test_an_empty_page_has_no_samples_and_no_totals() -> None:
    assert parse_text("") == {} and totals("") == {}
