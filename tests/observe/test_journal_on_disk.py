"""The on-disk journal (`proxy --journal`): each connection written as it goes and then
forgotten, the open ones ticked out, a total size cap with drop counts, a line cut by a
SIGKILL tolerated; and the redaction of secrets in every place a request is written
(no sockets: the relay's calls are made directly, with literal times)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from middlebox.core.stream import DOWN, UP
from middlebox.observe.journal import (
    DEFAULT_REDACTION,
    ConnectionJournal,
    JournalError,
    JournalView,
    JournalWriter,
    read_ndjson,
)
from tests.observe.test_journal import one_exchange

SECRETS = ("AIzaQUERYSECRET", "sk-BODYSECRET", "tok-HEADERSECRET", "org-ORGSECRET")
SECRET_REQUEST = (
    b"POST /v1/chat/completions?key=AIzaQUERYSECRET&stream=1 HTTP/1.1\r\nHost: x\r\n"
    b"X-Internal-Token: tok-HEADERSECRET\r\nOpenAI-Organization: org-ORGSECRET\r\n"
    b"Content-Type: application/json\r\nContent-Length: 62\r\n\r\n"
    b'{"model":"m","api_key":"sk-BODYSECRET","max_tokens":5,"n":1}  '
)


def writer_at(path: Path, **options: object) -> JournalWriter:
    return JournalWriter(lambda _cid: path, clock_offset=0.0, **options)  # type: ignore[arg-type]


def comparable(view: JournalView) -> tuple[object, ...]:
    key = lambda line: (line["time"], json.dumps(line, sort_keys=True))  # noqa: E731
    return (
        view.connection,
        view.opened_at,
        sorted(view.chunks, key=key),
        sorted(view.ends, key=key),
        sorted(view.faults, key=key),
        sorted(view.boundaries, key=key),
        view.captured,
        view.summary,
    )


def test_a_finished_connection_is_written_flushed_and_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "journal.ndjson"
    writer = writer_at(path)
    journal = writer.observer(3, 0.5)
    one_exchange(journal)
    writer.connection_ended(3)
    assert writer.journals == {}  # memory holds only open connections
    # flushed at the connection's end: another reader sees it before any close
    on_disk = read_ndjson(path)
    reference = tmp_path / "reference.ndjson"
    reference.write_text("".join(json.dumps(line) + "\n" for line in journal.to_lines()))
    assert [comparable(v) for v in on_disk] == [comparable(v) for v in read_ndjson(reference)]


def test_tick_writes_the_open_connections_so_far_and_the_pieces_read_as_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.ndjson"
    writer = writer_at(path)
    journal = writer.observer(1, 0.0)
    journal.read("client", UP, b"GET / HTTP/1.1\r\n", 1.0)
    writer.tick()
    first = [json.loads(text) for text in path.read_text().splitlines()]
    assert [line["type"] for line in first] == ["open", "read"]
    journal.read("client", UP, b"\r\n", 2.0)
    writer.tick()
    writer.tick()  # nothing new: nothing written twice
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["open", "read", "read"]
    writer.connection_ended(1)
    (view,) = read_ndjson(path)
    assert [chunk["offset"] for chunk in view.chunks] == [0, 16]
    assert view.summary["bytes"]["client.upstream"] == 18
    assert view.captured[("client", "upstream")] == b"GET / HTTP/1.1\r\n\r\n"


def test_the_size_cap_drops_lines_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "journal.ndjson"
    writer = writer_at(path, max_bytes=6000)
    for cid in range(1, 11):
        one_exchange(writer.observer(cid, 0.0))
        writer.connection_ended(cid)
    writer.close()
    lines = path.read_text().splitlines()
    totals = json.loads(lines[-1])
    assert totals["type"] == "journal" and "connection" not in totals
    written = len(read_ndjson(path))
    assert 0 < written < 10
    assert totals["connections"] == 10
    assert totals["dropped_connections"] == 10 - written
    assert totals["dropped_lines"] > 0
    assert path.stat().st_size - len(lines[-1]) - 1 <= 6000


def test_a_last_line_cut_by_a_sigkill_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "journal.ndjson"
    writer = writer_at(path)
    one_exchange(writer.observer(1, 0.0))
    writer.connection_ended(1)
    with path.open("a") as out:
        out.write('{"type":"read","connection":2,"ti')  # no newline: cut mid-write
    (view,) = read_ndjson(path)
    assert view.connection == 1 and view.summary


def test_a_file_that_is_no_journal_names_its_first_line_that_is_not_one(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text('{\n  "scenarios": []\n}\n')  # pretty-printed JSON, not NDJSON
    expected = "a journal (NDJSON: one JSON object a line, as `--journal` writes it) was expected"
    with pytest.raises(JournalError) as caught:
        read_ndjson(path)
    assert str(caught.value) == (
        f"{path}:1: not a JSON line (Expecting property name enclosed in double quotes); "
        + expected
    )
    path.write_text('{"type":"journal","connections":0}\n{"scenarios":[]}\n')
    with pytest.raises(
        JournalError, match=r"report\.json:2: not a journal line \(no `connection`\)"
    ):
        read_ndjson(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(JournalError, match=r"report\.json:1: not a journal line"):
        read_ndjson(path)
    path.write_bytes(b"\x0a\x0d\x0d\x0a\xff\xfe")  # a pcapng's first bytes
    with pytest.raises(JournalError, match=r"report\.json: not UTF-8 text \(byte 4\)"):
        read_ndjson(path)
    path.write_text('{"nope": ')  # one cut line is nothing cut from a journal
    with pytest.raises(JournalError, match=r"report\.json:1: not a JSON line"):
        read_ndjson(path)


def test_close_finishes_the_open_connections(tmp_path: Path) -> None:
    path = tmp_path / "journal.ndjson"
    writer = writer_at(path)
    one_exchange(writer.observer(1, 0.0))
    writer.close()
    (view,) = read_ndjson(path)
    assert view.summary["records"] > 0


# ------------------------------------------------------------------ secrets


def secret_journal() -> ConnectionJournal:
    journal = ConnectionJournal(1, 0.0, capture=True)
    journal.read("client", UP, SECRET_REQUEST, 1.0)
    journal.wrote("upstream", UP, SECRET_REQUEST, 1.1)
    response = b'HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n{"token":"Hello"}'
    journal.read("upstream", DOWN, response, 2.0)
    journal.wrote("client", DOWN, response, 2.1)
    return journal


def test_keys_in_the_query_the_body_and_custom_headers_are_redacted() -> None:
    journal = secret_journal()
    lines = journal.to_lines()
    text = json.dumps(lines) + "".join(
        base64.b64decode(str(line["base64"])).decode() for line in lines if line["type"] == "bytes"
    )
    for secret in SECRETS:
        assert secret not in text
    heads = [line for line in lines if line["type"] == "http_head" and line["leg"] == "client"]
    request = heads[0]
    assert "?key=[redacted]&stream=1" in str(request["start_line"])
    assert ["X-Internal-Token", "[redacted]"] in request["headers"]
    assert ["OpenAI-Organization", "[redacted]"] in request["headers"]
    assert ["Content-Type", "application/json"] in request["headers"]
    captured = {
        (line["leg"], line["direction"]): base64.b64decode(str(line["base64"]))
        for line in lines
        if line["type"] == "bytes"
    }
    body = captured[("client", "upstream")]
    assert b'"api_key":"[redacted]","max_tokens":5' in body
    # a response's logprobs-style "token" is generated text, kept
    assert b'{"token":"Hello"}' in captured[("client", "downstream")]
    raw = json.dumps(journal.to_lines(redact_secrets=False)) + "".join(
        base64.b64decode(str(line["base64"])).decode()
        for line in journal.to_lines(redact_secrets=False)
        if line["type"] == "bytes"
    )
    assert all(secret in raw for secret in SECRETS)  # --journal-secrets shows everything


def test_which_names_say_a_secret_and_the_list_is_configurable() -> None:
    says = DEFAULT_REDACTION.is_secret
    for name in (
        "Authorization",
        "Proxy-Authorization",
        "X-Api-Key",
        "api-key",
        "Cookie",
        "Set-Cookie",
        "X-Auth-Token",
        "OpenAI-Organization",
        "OpenAI-Project",
        "api_key",
        "access_token",
        "client_secret",
        "x-goog-api-key",
        "password",
    ):
        assert says(name), name
    for name in ("max_tokens", "x-ratelimit-remaining-tokens", "Content-Type", "model", "n"):
        assert not says(name), name
    assert not says("X-Tenant")
    assert DEFAULT_REDACTION.with_names("x-tenant").is_secret("X-Tenant")
    custom = DEFAULT_REDACTION.with_names("x-tenant")
    assert b"X-Tenant: [redacted]" in custom.data(b"GET / HTTP/1.1\r\nX-Tenant: acme\r\n\r\n")
