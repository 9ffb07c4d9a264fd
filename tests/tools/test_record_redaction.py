"""`middlebox record` blanks secrets by the journal's one rule: a key in the
query, the JSON body, a custom header or a name the user added leaves no trace in a
cassette, while the names and the rest of the request stay."""

from __future__ import annotations

import json

from middlebox.core.stream import DOWN, UP
from middlebox.observe.journal import DEFAULT_REDACTION, ConnectionJournal
from middlebox.tools.record import cassettes

SECRETS = ("sk-query-1", "sk-body-2", "tok-header-3", "org-4", "tenant-5", "resp-6")
BODY = json.dumps({"model": "m", "api_key": "sk-body-2", "max_tokens": 7, "messages": []}).encode()
REQUEST = (
    b"POST /v1/chat/completions?key=sk-query-1&stream=true HTTP/1.1\r\nHost: x\r\n"
    b"X-Custom-Token: tok-header-3\r\nOpenAI-Organization: org-4\r\nX-Tenant: tenant-5\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Session-Secret: resp-6\r\n"
    b"X-Request-Id: r-1\r\n\r\nok"
)


def recorded(journal: ConnectionJournal) -> dict[str, object]:
    journal.wrote("upstream", UP, REQUEST, 1.0)
    journal.read("upstream", DOWN, RESPONSE, 2.0)
    journal.ended("upstream", DOWN, "read_fin", 3.0)
    (cassette,) = cassettes(journal)
    return cassette


def test_no_secret_of_the_request_or_response_reaches_the_cassette() -> None:
    journal = ConnectionJournal(
        1, 0.0, capture=True, redaction=DEFAULT_REDACTION.with_names("X-Tenant")
    )
    cassette = recorded(journal)
    text = json.dumps(cassette)
    assert [secret for secret in SECRETS if secret in text] == []
    request = cassette["request"]
    assert isinstance(request, dict)
    assert request["target"] == "/v1/chat/completions?key=[redacted]&stream=true"
    assert request["body"]["api_key"] == "[redacted]" and request["body"]["max_tokens"] == 7
    assert ["X-Custom-Token", "[redacted]"] in request["headers"]
    assert ["OpenAI-Organization", "[redacted]"] in request["headers"]
    assert ["X-Tenant", "[redacted]"] in request["headers"]
    assert ["X-Session-Secret", "[redacted]"] in cassette["headers"]  # type: ignore[operator]
    assert ["X-Request-Id", "r-1"] in cassette["headers"]  # type: ignore[operator]


def test_a_name_only_the_user_adds_is_kept_without_it() -> None:
    cassette = recorded(ConnectionJournal(1, 0.0, capture=True))
    assert "tenant-5" in json.dumps(cassette)
    assert "sk-body-2" not in json.dumps(cassette)
