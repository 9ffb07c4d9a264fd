"""match.path is matched on the path as nginx matches locations: decoded and
normalised, so an encoded or dotted spelling of a matched path cannot slip past a fault."""

from __future__ import annotations

import random

import pytest

from faults._lib.match import RequestMatch, normalised_path, request_info
from middlebox.core.http1 import Head


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/%63ompletions", "/v1/chat/completions"),
        ("/v1/chat/%2563", "/v1/chat/%63"),  # decoded once, as nginx does
        ("/v1/./chat//completions", "/v1/chat/completions"),
        ("/v1/models/../chat/completions", "/v1/chat/completions"),
        ("/a/b/..", "/a/"),
        ("/../../x", "/x"),
        ("/v1/models", "/v1/models"),
        ("/", "/"),
    ],
)
def test_paths_are_decoded_and_dot_segments_resolved(path: str, expected: str) -> None:
    assert normalised_path(path) == expected


def test_an_encoded_chat_path_is_matched_by_the_plain_glob() -> None:
    head = Head("HTTP/1.1", (), method="POST", target="/v1/chat/%63ompletions?x=1")
    request = request_info(0, head, b"", complete=True)
    assert request.path == "/v1/chat/completions" and request.target.endswith("?x=1")
    match = RequestMatch(path="/v1/chat/completions")
    assert match.accepts(request)
    assert match.decide(request, 0.0, random.Random(0), {}, "k") is not None
