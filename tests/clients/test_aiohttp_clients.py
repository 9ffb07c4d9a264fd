"""The aiohttp clients of the matrix: `aiohttp-lines` and `aiohttp-naive`, on exact bytes.

Both run as real processes against tests/clients/test_builtin_clients.py's scripted
server (each wire condition one request, all at once), then each test reads one
condition's story from the result: the line loop reassembles split UTF-8 and the
per-read decoder does not (the mojibake the matrix needs a real client to produce);
neither checks `finish_reason`, so a clean close is a silent truncation; a cut body
raises aiohttp's own exceptions; a 429 is `raise_for_status()`'s error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from middlebox.clients import BUILTIN_CLIENTS
from middlebox.clients.aiohttp_lines import show_line
from middlebox.clients.aiohttp_naive import NaiveLines
from middlebox.clients.contract import Recorder, RequestSpec
from tests.clients.test_builtin_clients import UTF8_PIECES, Run, Started, workload_for

CLIENTS = ["aiohttp-lines", "aiohttp-naive"]


def recorder() -> Recorder:
    return Recorder(RequestSpec(index=0, endpoint="chat", body={"stream": True}))


# --- the pieces, without sockets -----------------------------------------------------------


def test_a_data_line_shows_its_delta_and_done_ends_the_loop() -> None:
    rec = recorder()
    frame = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n'
    assert show_line(rec, frame) is False
    assert show_line(rec, b": keep-alive\n") is False  # a comment is no data
    assert show_line(rec, b"\n") is False
    assert show_line(rec, b"data:[DONE]\n") is True  # the space after the colon is optional
    assert (rec.text, rec.saw_done) == ("Hi", True)


def test_the_naive_reader_turns_a_character_split_across_reads_into_replacement_marks() -> None:
    lines = NaiveLines()
    encoded = "data: é\n".encode()
    cut = encoded.index(b"\xc3") + 1
    assert lines.feed(encoded[:cut]) == []
    assert lines.feed(encoded[cut:]) == ["data: \ufffd\ufffd"]


def test_the_naive_reader_is_correct_when_no_read_splits_a_character() -> None:
    lines = NaiveLines()
    assert lines.feed("data: Grüße\ndata: 東".encode()) == ["data: Grüße"]
    assert lines.feed("京\n".encode()) == ["data: 東京"]
    assert lines.pending == ""


# --- on the wire ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    tmp: Path = tmp_path_factory.mktemp("aiohttp-clients")
    started = [Started(c, BUILTIN_CLIENTS[c], tmp, workload_for(c)) for c in CLIENTS]
    try:
        yield {s.client: s.finish() for s in started}
    finally:
        for s in started:
            s.stop()


def entry(runs: dict[str, Run], client: str, condition: str) -> dict[str, Any]:
    return runs[client].by_name[condition]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_complete_stream_is_shown_whole_up_to_done(runs: dict[str, Run], client: str) -> None:
    got = entry(runs, client, "complete")
    assert (got["error"], got["finish_reason"], got["saw_done"]) == (None, "stop", True)
    assert got["text"] and got["usage"] is not None


@pytest.mark.parametrize("client", CLIENTS)
def test_a_clean_close_without_done_ends_silently(runs: dict[str, Run], client: str) -> None:
    got = entry(runs, client, "clean-close")
    assert (got["error"], got["saw_done"], got["finish_reason"]) == (None, False, None)
    assert got["text"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_cut_body_raises_aiohttps_payload_error(runs: dict[str, Run], client: str) -> None:
    cut = entry(runs, client, "truncated-chunked")["error"] or ""
    reset = entry(runs, client, "rst")["error"] or ""
    assert cut.startswith("ClientPayloadError"), cut
    assert reset.split(":")[0] in {
        "ClientPayloadError", "ServerDisconnectedError", "ClientOSError"
    }, reset  # fmt: skip


@pytest.mark.parametrize("client", CLIENTS)
def test_a_429_is_raise_for_status_error_and_nothing_is_retried(
    runs: dict[str, Run], client: str
) -> None:
    got = entry(runs, client, "rate-limited")
    assert (got["error"] or "").startswith("ClientResponseError: 429")
    assert got["attempts"] == 1
    assert len(runs[client].server.requests_for("rate-limited")) == 1


@pytest.mark.parametrize("client", CLIENTS)
def test_an_in_band_error_frame_is_not_looked_for(runs: dict[str, Run], client: str) -> None:
    got = entry(runs, client, "inband-error")
    assert got["error"] is None


def test_the_line_loop_reassembles_split_utf8(runs: dict[str, Run]) -> None:
    assert entry(runs, "aiohttp-lines", "utf8-split")["text"] == "".join(UTF8_PIECES)


def test_the_per_read_decoder_shows_mojibake_on_split_utf8(runs: dict[str, Run]) -> None:
    text = entry(runs, "aiohttp-naive", "utf8-split")["text"]
    assert "\ufffd" in text
    assert text != "".join(UTF8_PIECES)
    assert text.replace("\ufffd", "").startswith("Gr")


@pytest.mark.parametrize("client", CLIENTS)
def test_abandoning_stops_reading_and_closes_the_connection(
    runs: dict[str, Run], client: str
) -> None:
    slow = entry(runs, client, "slow")
    assert slow["abandoned"] and [p for _, p in slow["chunks"]] == [" t0", " t1", " t2"]
    assert runs[client].server.first_note("slow")["gone_after_token"] is not None
    hang = entry(runs, client, "hang")
    assert hang["abandoned"] and hang["ended_at"] - hang["started_at"] < 4.0
