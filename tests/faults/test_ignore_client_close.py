"""ignore_client_close: the upstream keeps streaming after the client left."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.ignore_client_close import IgnoreClientClose
from faults.testing import TimedItem, joined, replay
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.netprops import assert_deterministic, timelines

# The request the upstream is answering when the client closes (an answer is owed)
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: up\r\nContent-Length: 2\r\n\r\n{}"
ASKED: TimedItem = (0.0, Chunk(UP, REQUEST))


def test_after_a_client_rst_the_next_write_fails_and_the_upstream_is_reset() -> None:
    fault = IgnoreClientClose()
    out = replay(
        fault,
        [
            (0.0, Chunk(DOWN, b"tok1")),
            (0.5, Reset(UP)),
            (1.0, Chunk(DOWN, b"tok2")),
            (2.0, Chunk(DOWN, b"tok3")),
            (3.0, Eof(DOWN)),
        ],
    )
    assert out == [(0.0, Chunk(DOWN, b"tok1")), (1.0, Reset(UP))]
    assert [(r.time, r.action, r.details) for r in fault.reports] == [
        (0.5, "client_close_ignored", {"kind": "rst", "offset": 4}),
        (1.0, "write_failed", {"drained": 4, "writes": 1}),
    ]


def test_after_a_client_fin_the_second_write_fails() -> None:
    out = replay(
        IgnoreClientClose(close_with="fin"),
        [
            ASKED,
            (0.5, Eof(UP)),
            (1.0, Chunk(DOWN, b"accepted by the kernel")),
            (1.5, Chunk(DOWN, b"fails")),
            (2.0, Chunk(DOWN, b"never read")),
        ],
    )
    assert out == [ASKED, (1.5, Eof(UP)), (1.5, Eof(DOWN))]


def test_with_a_corked_first_write_the_first_write_after_the_rst_delay_fails() -> None:
    fault = IgnoreClientClose(rst_delay=0.2)
    out = replay(
        fault,
        [
            ASKED,
            (0.50, Eof(UP)),
            (0.52, Chunk(DOWN, b"held by MSG_MORE")),
            (0.54, Chunk(DOWN, b"still accepted")),
            (0.70, Chunk(DOWN, b"RST not back yet")),
            (0.72, Chunk(DOWN, b"fails")),
            (0.74, Chunk(DOWN, b"never read")),
        ],
    )
    assert out == [ASKED, (0.72, Reset(UP)), (0.72, Eof(DOWN))]
    assert fault.reports[-1].details == {"drained": 51, "writes": 4}


def test_the_rst_delay_does_not_delay_a_client_rst() -> None:
    out = replay(
        IgnoreClientClose(rst_delay=0.2),
        [ASKED, (0.5, Reset(UP)), (0.52, Chunk(DOWN, b"fails at once"))],
    )
    assert out == [ASKED, (0.52, Reset(UP))]


def test_a_draining_proxy_passes_the_upstream_end_then_the_client_close() -> None:
    fault = IgnoreClientClose(until="never")
    out = replay(
        fault,
        [
            ASKED,
            (0.5, Eof(UP)),
            (1.0, Chunk(DOWN, b"ab")),
            (2.0, Chunk(DOWN, b"cde")),
            (3.0, Eof(DOWN)),
        ],
    )
    assert out == [ASKED, (3.0, Eof(DOWN)), (3.0, Eof(UP))]
    assert fault.reports[-1].action == "upstream_ended"
    assert fault.reports[-1].details == {"drained": 5, "end": "Eof"}


def test_an_upstream_reset_while_draining_ends_the_client_side_only() -> None:
    out = replay(
        IgnoreClientClose(until="never"),
        [ASKED, (0.5, Reset(UP)), (1.0, Chunk(DOWN, b"ab")), (2.0, Reset(DOWN))],
    )
    assert out == [ASKED, (2.0, Reset(DOWN))]


def test_nothing_changes_while_the_client_is_there() -> None:
    timeline: list[TimedItem] = [
        (0.0, Chunk(UP, b"GET")),
        (1.0, Chunk(DOWN, b"200")),
        (2.0, Eof(DOWN)),
    ]
    fault = IgnoreClientClose()
    assert replay(fault, timeline) == timeline
    assert not fault.fired


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"until": "forever"}, "until must be one of"),
        ({"close_with": "slam"}, "close_with"),
        ({"rst_delay": -0.1}, "rst_delay must be >= 0"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IgnoreClientClose(**config)


@given(
    timelines(directions=(DOWN,)),
    st.integers(0, 12),
    st.sampled_from([Eof(UP), Reset(UP)]),
    st.sampled_from(["write_fails", "never"]),
)
def test_the_client_gets_the_bytes_before_its_close_and_the_upstream_learns_late(
    downstream: list[TimedItem], position: int, close: Any, until: Any
) -> None:
    position = min(position, len(downstream))
    closed_at = downstream[position - 1][0] if position else 0.0
    timeline = [ASKED, *downstream[:position], (closed_at, close), *downstream[position:]]
    out = replay(IgnoreClientClose(until=until), timeline)
    assert joined(out, DOWN) == joined(downstream[:position], DOWN)
    upstream = [item for _, item in out if item.direction is UP and not isinstance(item, Chunk)]
    assert len(upstream) <= 1
    down_ends = [item for _, item in out if item.direction is DOWN and not isinstance(item, Chunk)]
    assert len(down_ends) <= 1
    if until == "never" and upstream:  # the client's close reaches the upstream after its end
        assert down_ends == [Eof(DOWN)]
        assert [item for _, item in out][-2:] == [Eof(DOWN), close]


@settings(max_examples=30)
@given(timelines(), st.integers(0, 2**32))
def test_the_same_input_gives_the_same_decisions(timeline: list[TimedItem], seed: int) -> None:
    assert_deterministic(lambda: IgnoreClientClose(), timeline, seed)


def test_with_a_cork_the_write_after_the_first_corked_write_fails() -> None:
    # HAProxy: frames every 50 ms, FIN at 0.50; the first write (0.55) is corked until
    # 0.75; the write at 0.75 joins the released segment, so the one at 0.80 fails
    # (rst_delay would fail the 0.75 one, a frame early).
    fault = IgnoreClientClose(cork=0.2)
    timeline: list[TimedItem] = [ASKED, (0.50, Eof(UP))]
    timeline += [(0.55 + 0.05 * i, Chunk(DOWN, b"frame")) for i in range(8)]
    out = replay(fault, timeline)
    assert out == [ASKED, (0.80, Reset(UP)), (0.80, Eof(DOWN))]
    assert fault.reports[-1].details == {"drained": 30, "writes": 6}


def test_a_cork_does_not_delay_a_client_rst() -> None:
    out = replay(
        IgnoreClientClose(cork=0.2),
        [ASKED, (0.5, Reset(UP)), (0.52, Chunk(DOWN, b"fails at once"))],
    )
    assert out == [ASKED, (0.52, Reset(UP))]


def test_rst_delay_and_cork_are_not_both_set() -> None:
    with pytest.raises(ValueError, match="not both"):
        IgnoreClientClose(rst_delay=0.2, cork=0.2)


ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_a_close_after_the_whole_answer_goes_on_at_once_unreported() -> None:
    # an idle keep-alive connection: nginx, HAProxy and Apache close it when the client does
    fault = IgnoreClientClose()
    timeline: list[TimedItem] = [ASKED, (0.1, Chunk(DOWN, ANSWER)), (0.2, Eof(UP))]
    assert replay(fault, timeline) == timeline
    assert not fault.fired


def test_a_close_before_anything_passed_goes_on() -> None:
    # another hop answered the client itself (an http_error nearer it): nothing is owed here
    fault = IgnoreClientClose()
    assert replay(fault, [(0.2, Eof(UP))]) == [(0.2, Eof(UP))]
    assert not fault.fired


def test_a_close_while_a_second_request_waits_for_its_answer_is_ignored() -> None:
    fault = IgnoreClientClose(until="never")
    out = replay(
        fault,
        [ASKED, (0.1, Chunk(DOWN, ANSWER)), (1.0, Chunk(UP, REQUEST)), (1.5, Eof(UP)),
         (2.0, Chunk(DOWN, ANSWER)), (3.0, Eof(DOWN))],
    )  # fmt: skip
    assert out == [
        ASKED, (0.1, Chunk(DOWN, ANSWER)), (1.0, Chunk(UP, REQUEST)), (3.0, Eof(DOWN)),
        (3.0, Eof(UP)),
    ]  # fmt: skip
    assert [r.action for r in fault.reports] == ["client_close_ignored", "upstream_ended"]


def test_a_close_mid_answer_is_ignored_even_if_the_answer_is_not_http() -> None:
    fault = IgnoreClientClose(until="never")
    out = replay(fault, [(0.0, Chunk(DOWN, b"tok1")), (0.5, Eof(UP)), (1.0, Eof(DOWN))])
    assert out == [(0.0, Chunk(DOWN, b"tok1")), (1.0, Eof(DOWN)), (1.0, Eof(UP))]
