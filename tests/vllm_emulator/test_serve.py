"""The readiness banner: one format, written once, first on stdout."""

from __future__ import annotations

import pytest

from vllm_emulator.serve import BANNER_PREFIX, banner, print_banner


def test_the_banner_is_a_url_a_parent_can_split_off() -> None:
    assert banner("127.0.0.1", 8000) == "listening on http://127.0.0.1:8000"
    assert banner("127.0.0.1", 8000).split(BANNER_PREFIX, 1)[1] == "http://127.0.0.1:8000"


def test_an_ipv6_host_is_bracketed_as_a_url_requires() -> None:
    # RFC 3986 §3.2.2: an IPv6 literal in a URL's authority is written in brackets.
    assert banner("::1", 9) == "listening on http://[::1]:9"


def test_the_ready_callback_prints_exactly_one_line_with_the_bound_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_banner("localhost")(43210)
    assert capsys.readouterr().out == "listening on http://localhost:43210\n"
