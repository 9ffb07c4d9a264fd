"""Two-sided scoring: verdicts on the client and the server of every logical request (pure).

Inputs per (scenario, client): the client's result file (what it showed, when, and
what error it surfaced), the upstream's ledger (what was generated, when, and
whether generation stopped when the client left) and the proxy's journal (the bytes
the upstream sent, to see heartbeats, usage, in-band errors and headers). Outputs are
plain data: categorical `verdicts` (identical across runs with the same seed) and
timing `metrics` (which vary with the machine), then the `expect:` checks. The metric names
an `expect:` block may check are the scenario format's (`middlebox.scenario.expect`).

Client verdicts per request, worst first: `upstream_error` (a real server answered every
attempt with an HTTP error status: nothing was streamed to judge the client by), `hang` (no
result in bound), `no_result` (the client ended without a result the scorer can read: none,
or one that breaks the contract), `silent_truncation`
(reported success with less text than generated: the worst outcome a user can get),
`mojibake`, `duplicated`, `missing_tokens`, `truncation_detected`, `error_reported`
(the client showed no text and surfaced an error: one rule, whether or not the upstream
had begun generating), `abandoned` (on purpose), `complete_then_error` (the whole answer
shown, then an error surfaced: a real app may discard it or retry the whole generation),
`complete`.

Attempts come from the wire: each request on the client leg of the journal whose body
carries the logical request's tag is one attempt, answered by the upstream or by a fault
(a gateway's 429); the client's own `attempts` is only a cross-check. A client's
`finish_reason` is compared with the one that reached it on its leg: `length` hidden or
`stop` invented is flagged per request (`finish_flag`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, TypeVar
from urllib.parse import urlsplit

from middlebox.core.dialects import (
    NATURAL_STOPS,
    Dialect,
    EndKind,
    Meaning,
    TokenKind,
    dialect_for,
    end_of_reason,
    json_payload,
    read,
)
from middlebox.core.framed import LegRecord, is_event_stream
from middlebox.core.stream import Direction
from middlebox.observe.requests import (
    BURST_GAP,
    WASTE_SLACK,
    arrivals,
    ledger_for,
    tokens_after,
    tokens_reached,
    tokens_wasted,
    upstream_tokens_per_burst,
)
from middlebox.run.agent_checks import judge_agents

DELIVERED_TOKENS_PER_BURST = "client.delivered_tokens_per_burst"
"""The path's lumps at the client's socket (`delivered_tokens_per_burst`): a buffering hop
lumps these; a client that holds text back lumps only what it shows."""

SERVER_TOKENS_PER_BURST = "server.tokens_per_burst"
"""The upstream's own lumpiness, the floor of what a client can see: from the emulator's
token times, or a real server's frames as they reached the proxy (middlebox.run.suite)."""


@dataclass
class RequestScore:
    index: int
    verdict: str
    expected_chars: int
    shown_chars: int
    attempts: int
    generations: int
    error: str | None = None
    # what the client said about itself, kept as a cross-check of the wire's `attempts`
    reported_attempts: int | None = None
    finish_reason: str | None = None  # the client's
    upstream_finish_reason: str | None = None
    # the one that crossed the client's leg: a cut before the finish chunk hides nothing
    reached_finish_reason: str | None = None
    finish_flag: str | None = None  # "length_hidden", "stop_invented" or None
    # digests of the expected and shown text: `replay` proves the same text, not only
    # the same verdicts
    expected_digest: str = ""
    shown_digest: str = ""
    # how the upstream split that text into events (`upstream_split`, the lengths
    # comma-separated: compact in report.json): a shown text that differs where the split
    # did too is the run's timing, not its seed
    upstream_split: str = ""
    # Responses-API events its client was sent over the create and resume legs: skipped
    # between two it was sent, and sent twice (`sequence_faults`)
    sequence_gaps: int = 0
    sequence_repeats: int = 0
    # a real server's error status when it answered every attempt with one (verdict
    # `upstream_error`); a fault's own answer (http_error) never reaches the upstream leg
    upstream_status: int | None = None


@dataclass
class Check:
    name: str
    condition: str
    expected: Any
    actual: Any
    passed: bool
    # how the bound was judged when not as written (a real server's decoding time)
    note: str = ""

    def describe(self) -> str:
        said = f"{self.name} {self.condition} {self.expected}: got {self.actual}"
        return f"{said} ({self.note})" if self.note else said


@dataclass
class ClientScore:
    scenario: str
    client: str
    requests: list[RequestScore] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    faults_fired: list[str] = field(default_factory=list)
    faults_declared: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    # cross-checks that do not fail the run: a client's self-reported attempts that
    # differ from what the wire shows
    notes: list[str] = field(default_factory=list)
    # each take of this client, when a failed one was taken again (middlebox.run.takes),
    # with its disturbance and whether it was kept
    takes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def verdicts(self) -> dict[str, Any]:
        """The categorical, seed-deterministic part of the score."""
        return {
            "requests": [request.verdict for request in self.requests],
            "finish_flags": [request.finish_flag for request in self.requests],
            "faults_fired": self.faults_fired,
            "checks": {check.name: check.passed for check in self.checks},
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "client": self.client,
            "verdicts": self.verdicts(),
            "requests": [vars(request) for request in self.requests],
            "metrics": self.metrics,
            "faults_declared": self.faults_declared,
            "checks": [vars(check) for check in self.checks],
            "notes": self.notes,
            **({"takes": self.takes} if len(self.takes) > 1 else {}),
        }


# ----------------------------------------------------------------- client side


def request_verdict(expected: str | None, result: Mapping[str, Any] | None) -> str:
    """Judge one logical request from what was generated and what the client showed."""
    if result is None:
        return "hang"
    if result.get("abandoned"):
        return "abandoned"
    shown: str = result.get("text") or ""
    error = result.get("error")
    if error and not shown:
        # One rule for "nothing shown, an error surfaced", whether or not the upstream
        # had begun generating: the user saw no answer and was told so.
        return "error_reported"
    if expected is None:
        # Nothing finished upstream to compare with: the request never reached the
        # server (a 429 from a hop), or a real server's stream never finished.
        if error:
            return "truncation_detected" if shown else "error_reported"
        return "silent_truncation"
    if shown == expected:
        # The whole answer, then an error (an RST after the last token: openai-python
        # raises APIConnectionError, httpx-sse, aiohttp and fetch raise too): the user
        # saw it all, but the app was told it failed and may discard or retry it.
        return "complete_then_error" if error else "complete"
    if "\ufffd" in shown and "\ufffd" not in expected:
        return "mojibake"
    if expected.startswith(shown):
        return "truncation_detected" if error else "silent_truncation"
    if len(shown) > len(expected):
        return "duplicated"
    return "missing_tokens"


UpstreamLeg = tuple[bytes, bytes] | LegRecord
"""A connection's upstream leg: the journal's framed `LegRecord` (framed once), or its
captured (request bytes, response bytes), which are then framed once here."""


def _framed(leg: UpstreamLeg) -> LegRecord:
    return leg if isinstance(leg, LegRecord) else LegRecord.from_bytes(*leg)


def _dialects(record: LegRecord) -> dict[int, Dialect | None]:
    """Per request of a framed leg, the dialect of the stream that answers it (by its
    method and target; a response to a request not seen reads by its events' shape)."""
    return {
        message: dialect_for(head.method, head.target)
        for message, _, _, head in record.heads[Direction.UPSTREAM]
        if head.method is not None and head.target is not None
    }


def _meanings(record: LegRecord) -> Iterable[tuple[int, int, Meaning]]:
    """Each response event of a framed leg, with its message and stream offset, read in
    its stream's dialect (`middlebox.core.dialects`, the one rule every reader shares)."""
    dialects = _dialects(record)
    for message, offset, event in record.events[Direction.DOWNSTREAM]:
        yield message, offset, read(event, dialects.get(message))


def _streamed(record: LegRecord) -> dict[int, tuple[str, bool]]:
    """Per event-stream response of one framed leg, the answer text it streamed (choice
    0's) and whether it finished without an error (`upstream_generations`)."""
    texts: dict[int, list[str]] = {}
    finished: dict[int, bool] = {}
    failed: set[int] = set()
    for message, _, _, head in record.heads[Direction.DOWNSTREAM]:
        if is_event_stream(head):
            texts[message], finished[message] = [], False
    for message, _, meaning in _meanings(record):
        if message not in texts:
            continue
        finished[message] = finished[message] or meaning.last or meaning.end is not None
        if meaning.end is EndKind.ERROR:
            failed.add(message)
        if meaning.token is TokenKind.ANSWER and meaning.choice == 0:
            texts[message].append(meaning.text)
    return {
        message: ("".join(parts), finished[message] and message not in failed)
        for message, parts in texts.items()
    }


def upstream_generations(traffic: Iterable[UpstreamLeg]) -> list[tuple[str, str, bool]]:
    """What a real server sent, from the upstream leg of the journal: per generation, the
    request body it answered, the answer text it streamed (choice 0's) and whether it
    finished (its answer ended, or its stream's last event came: a finish_reason or
    `[DONE]`, a stop_reason or `message_stop`, `response.completed`) without an error: vLLM's
    `data: {"error": ...}` frame followed by `[DONE]` is a failed generation, as the
    emulator's ledger says `finish_reason: error`. A Responses-API response is one
    generation however many legs read it: its create's body with the whole answer its
    create and resume legs sent together (`response_answers`); a resume
    (`GET /v1/responses/{id}`) is no generation of its own. This is the expected text when
    there is no emulator ledger."""
    legs = [_framed(leg) for leg in traffic]
    whole = response_answers(legs)
    found: list[tuple[str, str, bool]] = []
    for record in legs:
        ids = response_ids(record)
        resumes = _resume_messages(record)
        for message, (text, done) in _streamed(record).items():
            if message in resumes:
                continue
            answer = whole.get(ids.get(message, ""))
            if answer is not None:
                text, done = answer.text, answer.finished
            body = record.request_body(message).decode("utf-8", "replace")
            found.append((body, text, done))
    return found


def _resume_messages(record: LegRecord) -> set[int]:
    """The requests of a framed leg that read a stored response (`GET /v1/responses/{id}`)."""
    return {
        message
        for message, _, _, head in record.heads[Direction.UPSTREAM]
        if head.method is not None
        and head.target is not None
        and head.method.upper() == "GET"
        and dialect_for(head.method, head.target) is Dialect.RESPONSES
    }


def response_ids(record: LegRecord) -> dict[int, str]:
    """Per request of a framed leg that is about one Responses-API response, its id: a
    resume's from its target (`GET /v1/responses/{id}`), a create's from the first of its
    events that names `response.id` (`response.created`)."""
    ids: dict[int, str] = {}
    resumes = _resume_messages(record)
    for message, _, _, head in record.heads[Direction.UPSTREAM]:
        if message in resumes and head.target is not None:
            ids[message] = urlsplit(head.target).path.rstrip("/").rsplit("/", 1)[-1]
    for message, _, event in record.events[Direction.DOWNSTREAM]:
        if message in ids:
            continue
        payload = json_payload(event)
        response = payload.get("response") if payload is not None else None
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            ids[message] = response["id"]
    return ids


@dataclass(frozen=True)
class ResponseAnswer:
    """A Responses-API response's whole answer as the server sent it over all its legs."""

    text: str
    finished: bool
    reason: str | None
    sequences: frozenset[int]
    # events that added text (the one rule's tokens) among those sent: vLLM writes one
    # delta per decoding step that adds text, so this is the tokens that crossed the leg
    token_events: int = 0


def response_answers(traffic: Iterable[UpstreamLeg]) -> dict[str, ResponseAnswer]:
    """Per Responses-API response id, the server's whole answer: the union, by
    `sequence_number`, of the events it sent on the create leg and on every resume leg
    (`GET /v1/responses/{id}?stream=true&starting_after=N`) of that response, read in
    sequence order. A background response's event store numbers its events once, so an
    event sent on two legs is one event; `finished` when its terminal event was sent on
    any leg (and it said no error), `reason` that event's word (`completed`,
    `max_output_tokens`, `cancelled`). Where the union has a hole (a resume past an event
    no leg carried) the deltas cannot tell the whole text, and each content part's
    `response.output_text.done` (which repeats its whole text) tells it instead."""
    events: dict[str, dict[int, Meaning]] = {}
    done_texts: dict[str, dict[int, str]] = {}
    for leg in traffic:
        record = _framed(leg)
        ids = response_ids(record)
        dialects = _dialects(record)
        for message, _, event in record.events[Direction.DOWNSTREAM]:
            rid = ids.get(message)
            meaning = read(event, dialects.get(message))
            if rid is None or meaning.sequence is None or meaning.dialect is not Dialect.RESPONSES:
                continue
            events.setdefault(rid, {}).setdefault(meaning.sequence, meaning)
            payload = json_payload(event) or {}
            if payload.get("type") == "response.output_text.done":
                text = payload.get("text")
                done_texts.setdefault(rid, {})[meaning.sequence] = str(text or "")
    answers: dict[str, ResponseAnswer] = {}
    for rid, numbered in events.items():
        ordered = [numbered[number] for number in sorted(numbered)]
        ends = [meaning for meaning in ordered if meaning.end is not None]
        text = "".join(m.text for m in ordered if m.token is TokenKind.ANSWER)
        holes = len(numbered) < max(numbered) + 1
        dones = done_texts.get(rid, {})
        if holes and dones:
            text = "".join(dones[number] for number in sorted(dones))
        answers[rid] = ResponseAnswer(
            text=text,
            finished=bool(ends) and all(m.end is not EndKind.ERROR for m in ends),
            reason=ends[-1].reason if ends else None,
            sequences=frozenset(numbered),
            token_events=sum(1 for m in ordered if m.token is not None),
        )
    return answers


def sequence_faults(client_traffic: Iterable[UpstreamLeg], tag: str) -> tuple[int, int]:
    """Gaps and repeats in the `sequence_number`s one logical request's client was sent,
    over its create and resume legs of each of its Responses-API responses, in the order
    they crossed the client leg: (events skipped between two it was sent, events it was
    sent again). A resume whose `starting_after` is past the last event the client had
    leaves a gap (those events never reach it); one before it brings a repeat (shown
    again unless the client skips it). A stream cut short is no gap: nothing came after
    it. (0, 0) for a request with no Responses stream."""
    legs = [_framed(leg) for leg in client_traffic]
    mine = _stored_responses(legs, tag)
    seen: dict[str, set[int]] = {}
    gaps = repeats = 0
    for record in legs if mine else ():
        ids = response_ids(record)
        if not mine.intersection(ids.values()):
            continue
        for message, _, meaning in _meanings(record):
            rid = ids.get(message)
            if rid not in mine or meaning.sequence is None:
                continue
            numbers = seen.setdefault(rid, set())
            if meaning.sequence in numbers:
                repeats += 1
                continue
            gaps += max(meaning.sequence - max(numbers, default=-1) - 1, 0)
            numbers.add(meaning.sequence)
    return gaps, repeats


def _finish_reasons(record: LegRecord) -> dict[int, str | None]:
    """Per event-stream response of a framed leg, the last reason its answer ended with,
    in its API's words (choice 0's `finish_reason`, a `stop_reason`, a response's status
    or `incomplete_details.reason`; None: the stream never said why it ended; "error"
    when an in-band error came instead)."""
    reasons: dict[int, str | None] = {}
    for message, _, _, head in record.heads[Direction.DOWNSTREAM]:
        if is_event_stream(head):
            reasons[message] = None
    for message, _, meaning in _meanings(record):
        if message in reasons and meaning.end is not None and meaning.choice == 0:
            reasons[message] = meaning.reason
    return reasons


def upstream_finish_reasons(traffic: Iterable[UpstreamLeg]) -> list[tuple[str, str | None]]:
    """Per event-stream response on the upstream leg, its request body and the last
    `finish_reason` of choice 0 it carried (`_finish_reasons`)."""
    legs = [_framed(leg) for leg in traffic]
    whole = response_answers(legs)
    found: list[tuple[str, str | None]] = []
    for record in legs:
        ids = response_ids(record)
        resumes = _resume_messages(record)
        for message, reason in _finish_reasons(record).items():
            if message in resumes:
                continue  # its response's create carries the whole answer's end
            answer = whole.get(ids.get(message, ""))
            if answer is not None:
                reason = answer.reason
            found.append((record.request_body(message).decode("utf-8", "replace"), reason))
    return found


def delivered_finish_reasons(client_traffic: Iterable[UpstreamLeg], tag: str) -> list[str | None]:
    """What reached the client of one logical request's ending: per event-stream response
    to it on the client leg, in order, the last `finish_reason` that crossed toward the
    client (None: the response ended, or was cut, before a finish chunk crossed). A resume
    by `GET /v1/streams/{id}` carries no body to find the tag in: it belongs to the request
    when an earlier response of it named that stream (`X-Stream-Id`), and a
    `GET /v1/responses/{id}` when a stream of it named that response. Empty when the leg
    shows none of its responses as events (a content-coded body, an HTTP/2 leg)."""
    found: list[str | None] = []
    streams: set[str] = set()
    legs = [_framed(leg) for leg in client_traffic]
    responses = _stored_responses(legs, tag)
    for record in legs:
        targets = {m: head.target or "" for m, _, _, head in record.heads[Direction.UPSTREAM]}
        named = {
            m: head.header("x-stream-id")
            for m, _, _, head in record.heads[Direction.DOWNSTREAM]
            if head.header("x-stream-id")
        }
        for message, reason in _finish_reasons(record).items():
            body = record.request_body(message).decode("utf-8", "replace")
            target = targets.get(message, "").split("?")[0]
            if (
                tag in body
                or any(target.endswith(f"/streams/{sid}") for sid in streams)
                or _retrieves(record, message, responses)
            ):
                found.append(reason)
                if named.get(message):
                    streams.add(str(named[message]))
    return found


def upstream_statuses(traffic: Iterable[UpstreamLeg], tag: str) -> list[int]:
    """The status of each final response the upstream sent to one logical request's requests
    (`_requests_for`), in order: what the server itself answered, as its leg of the journal
    saw it. A fault that answers on its own (http_error) is on the client leg only."""
    legs = [_framed(leg) for leg in traffic]
    stored = _stored_responses(legs, tag)
    statuses: list[int] = []
    for record in legs:
        asked = _requests_for(record, tag, stored)
        statuses += [
            head.status
            for message, _, _, head in record.heads[Direction.DOWNSTREAM]
            if message in asked and head.status is not None and not head.is_interim
        ]
    return statuses


def refused_by_upstream(statuses: Sequence[int]) -> int | None:
    """The error status the upstream answered a request with when it answered every
    attempt with one (the last); None when it streamed one, or was never asked."""
    if statuses and all(status >= 400 for status in statuses):
        return statuses[-1]
    return None


def upstream_problem(score: ClientScore) -> str | None:
    """A run the upstream answered with nothing but HTTP errors, as a problem of the run:
    it tested no client. None when one request got a stream from it."""
    refused = {request.upstream_status for request in score.requests}
    if not score.requests or None in refused:
        return None
    said = ", ".join(f"HTTP {status}" for status in sorted(s for s in refused if s is not None))
    return (
        f"the upstream answered every request with an error ({said}) and streamed nothing, "
        "so the run tested no client; check that the upstream serves the OpenAI API for "
        "the model its /v1/models names (--upstream)"
    )


def wire_attempts(client_traffic: Iterable[UpstreamLeg], tag: str) -> int:
    """HTTP requests the client sent for one logical request: those on the client leg
    whose body carries its tag, whoever answered them (the upstream, or a fault such as
    a gateway's 429 that never let them through), and its resumes of a background
    response (`GET /v1/responses/{id}`, no body: `_stored_responses`)."""
    legs = [_framed(leg) for leg in client_traffic]
    responses = _stored_responses(legs, tag)
    return sum(len(_requests_for(record, tag, responses)) for record in legs)


def _requests_for(record: LegRecord, tag: str, responses: set[str]) -> set[int]:
    """The requests on a leg made for one logical request: its body carries `tag`, or it
    resumes one of its Responses-API `responses` (`GET /v1/responses/{id}`, no body)."""
    return {
        message
        for message, _, _, _ in record.heads[Direction.UPSTREAM]
        if tag in record.request_body(message).decode("utf-8", "replace")
        or _retrieves(record, message, responses)
    }


def _stored_responses(legs: Sequence[LegRecord], tag: str) -> set[str]:
    """The ids of the Responses-API responses made for one logical request: those its
    requests' streams named (`response.created` and every event carrying `response.id`), so
    that a resume by `GET /v1/responses/{id}?stream=true`, which carries no body to find
    the tag in, is counted as the same request's."""
    ids: set[str] = set()
    for record in legs:
        asked = {
            message
            for message, _, _, _ in record.heads[Direction.UPSTREAM]
            if tag in record.request_body(message).decode("utf-8", "replace")
        }
        for message, _, event in record.events[Direction.DOWNSTREAM]:
            if message not in asked:
                continue
            payload = json_payload(event)
            response = payload.get("response") if payload is not None else None
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                ids.add(response["id"])
    return ids


def _retrieves(record: LegRecord, message: int, responses: set[str]) -> bool:
    """The request is a `GET /v1/responses/{id}` of one of `responses`."""
    for found, _, _, head in record.heads[Direction.UPSTREAM]:
        if found == message and head.method is not None and head.target is not None:
            path = head.target.split("?")[0].rstrip("/")
            return head.method.upper() == "GET" and any(
                path.endswith(f"/responses/{rid}") for rid in responses
            )
    return False


SPLIT_KEPT = 512
"""Events of a request's upstream split kept in the report (`upstream_split`): where a
fault counting events or tokens lands depends on the first ones."""


def upstream_split(traffic: Iterable[UpstreamLeg], tag: str) -> list[int]:
    """How the upstream split its answers to one logical request into events: per
    response on the upstream leg to a request carrying `tag` (or a resume of one of its
    Responses-API responses), in order, the length of the text each event added (the
    first SPLIT_KEPT). The same seed gives the same text but not the same split: a server
    whose writer lags merges the tokens made meanwhile into one event (vLLM's
    RequestOutputCollector; the emulator does the same), so a fault that counts events or
    tokens then cuts elsewhere and a client shows other text. `replay` tells that apart
    from the same split giving other text."""
    legs = [_framed(leg) for leg in traffic]
    stored = _stored_responses(legs, tag)
    split: list[int] = []
    for record in legs:
        asked = _requests_for(record, tag, stored)
        texts: dict[int, list[int]] = {}
        for message, _, meaning in _meanings(record):
            if message in asked:
                texts.setdefault(message, []).append(len(meaning.text))
        for message in sorted(texts):
            split += texts[message]
    return split[:SPLIT_KEPT]


def finish_flag(
    reported: str | None, reached: str | None, result: Mapping[str, Any] | None
) -> str | None:
    """Judge the client's `finish_reason` against the one that reached it (`reached`:
    the last that crossed its leg; `reached_reason`), each in its API's words. `length_hidden`:
    the stream's length cut (`length`, `max_tokens`, `max_output_tokens`) reached the client
    and the client, reporting success, did not say so (the seed article: "a completed
    stream is not a complete answer"); a stream cut before its finish chunk hid nothing
    the client could have seen. `stop_invented`: the client says the model stopped
    (`stop`, `end_turn`, `completed`) where no such stop reached it (cut, aborted, failed or
    cut at its limit)."""
    if result is None or result.get("abandoned"):
        return None
    # In each API's words (core.dialects): chat's stop/length, Messages' end_turn/max_tokens,
    # a Responses completed/max_output_tokens.
    if reported in NATURAL_STOPS and reached not in NATURAL_STOPS:
        return "stop_invented"
    length = EndKind.LENGTH
    if end_of_reason(reached) is length and end_of_reason(reported) is not length:
        return None if result.get("error") else "length_hidden"
    return None


WHOLE_ANSWER = ("complete", "complete_then_error")
"""Verdicts of a request whose client was shown the whole answer the upstream made."""


def reached_reason(
    delivered: Sequence[str | None], upstream: str | None, verdict: str
) -> str | None:
    """The finish_reason that reached the client: the last one its leg carried
    (`delivered_finish_reasons`). Where the leg cannot say (no journal of it, a
    content-coded body), the upstream's when the client was shown the whole answer (the
    finish chunk carries the last token), else none."""
    if delivered:
        return next((reason for reason in reversed(delivered) if reason is not None), None)
    return upstream if verdict in WHOLE_ANSWER else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def display_metrics(result: Mapping[str, Any]) -> dict[str, Any]:
    chunks = [(float(t), str(text)) for t, text in result.get("chunks") or [] if text]
    started = float(result.get("started_at") or 0.0)
    out: dict[str, Any] = {"itl_ms": [], "bursts": 0, "largest_gap_ms": 0.0}
    if not chunks:
        return out
    times = [t for t, _ in chunks]
    out["ttft_ms"] = (times[0] - started) * 1000
    gaps = [(b - a) * 1000 for a, b in pairwise(times)]
    out["itl_ms"] = gaps
    out["largest_gap_ms"] = max(gaps, default=0.0)
    out["bursts"] = 1 + sum(1 for gap in gaps if gap > BURST_GAP * 1000)
    if result.get("error") and result.get("ended_at"):
        out["stall_detect_ms"] = (float(result["ended_at"]) - times[-1]) * 1000
    return out


# ----------------------------------------------------------------- server side


def analyse_upstream(request_bytes: bytes, response_bytes: bytes) -> dict[str, int]:
    """`analyse_upstream_leg` of captured bytes (framed once here)."""
    return analyse_upstream_leg(LegRecord.from_bytes(request_bytes, response_bytes))


def analyse_upstream_leg(record: LegRecord) -> dict[str, int]:
    """Heartbeats, usage, in-band errors and X-Accel-Buffering in what the upstream sent."""
    counts = {"heartbeats": 0, "usage_reported": 0, "inband_errors": 0, "x_accel_buffering_no": 0}
    streams = set()
    for message, _, _, head in record.heads[Direction.DOWNSTREAM]:
        if (head.header("x-accel-buffering") or "").strip().lower() == "no":
            counts["x_accel_buffering_no"] += 1
        if is_event_stream(head):
            streams.add(message)
    counts["heartbeats"] = sum(n for message, n in record.comments.items() if message in streams)
    usage_seen: set[int] = set()
    dialects = _dialects(record)
    for message, _, event in record.events[Direction.DOWNSTREAM]:
        payload = json_payload(event) if message in streams else None
        if payload is None:
            continue
        if read(event, dialects.get(message)).end is EndKind.ERROR:
            counts["inband_errors"] += 1
        # Chat's usage chunk and Messages' `message_delta` carry `usage`; a Responses
        # stream reports it in its terminal event's `response` (null until then).
        response = payload.get("response")
        usage = payload.get("usage") or (
            response.get("usage") if isinstance(response, dict) else None
        )
        if usage and message not in usage_seen:
            usage_seen.add(message)
            counts["usage_reported"] += 1
    return counts


def background_waste(entry: Mapping[str, Any], to_client: Mapping[str, ResponseAnswer]) -> int:
    """Tokens a background Responses generation (`background` in the emulator's ledger) made
    for nobody. Such a response keeps generating after its client disconnects: that is its
    purpose (vLLM runs it as a task of its own), so what it makes while its client is away
    and then reads on a resume is no waste. Its client was sent its end (its terminal event
    crossed the client leg, on any leg of the response; `to_client` is `response_answers`
    of the client leg): nothing was made for nobody. Otherwise what it generated past what
    it delivered went to nobody: what it made after the user gave up and did not cancel,
    after a cancel (`cancelled_at`, `POST /v1/responses/{id}/cancel`), or on its own after
    a restarting client left it for a new response. A foreground Responses stream is
    judged as chat is (vLLM aborts it on the disconnect)."""
    answer = to_client.get(str(entry.get("id")))
    if answer is not None and answer.reason is not None and answer.reason != "cancelled":
        return 0
    # what the emulator wrote into a connection the path then reset (its socket buffers took
    # it; a handoff's outage holds it there) reached nobody: delivered is what crossed the
    # client leg where the journal says less
    delivered = int(entry.get("delivered_tokens") or 0)
    reached = answer.token_events if answer is not None else 0
    undelivered = int(entry.get("completion_tokens") or 0) - min(delivered, reached)
    cancelled = entry.get("cancelled_at")
    after_cancel = tokens_after([entry], float(cancelled)) if cancelled else 0
    return max(undelivered, after_cancel, 0)


Entry = TypeVar("Entry", bound=Mapping[str, Any])


def judged_entry(
    entry: Mapping[str, Any], to_client: Mapping[str, ResponseAnswer]
) -> Mapping[str, Any]:
    """A ledger entry whose `wasted_tokens` a background response's own rule sets
    (`background_waste`); any other entry as the emulator wrote it."""
    if not entry.get("background"):
        return entry
    return {**entry, "wasted_tokens": background_waste(entry, to_client)}


def split_replays(ledger: Sequence[Entry]) -> tuple[list[Entry], list[Entry]]:
    """The emulator's ledger split into the generations it ran and the responses it
    replayed from a cassette. A replay generates nothing, so its entry records no text
    and no finish reason (`planned_text` and `text` null, docs/emulator.md): what the
    upstream sent is the recorded response, which the journal's upstream leg carries.
    A replayed request is therefore judged from that leg as a real server's is
    (`upstream_generations`, `upstream_finish_reasons`); its entry still counts a
    generation the upstream served (`server_metrics`)."""
    generated = [entry for entry in ledger if not entry.get("cassette")]
    replayed = [entry for entry in ledger if entry.get("cassette")]
    return generated, replayed


def server_metrics(entries: list[Mapping[str, Any]]) -> dict[str, Any]:
    # A cancelled background response is aborted by its cancel, not by a disconnect it
    # outlives: its latency runs from the cancel.
    latencies = [
        (entry["aborted_at"] - (entry.get("cancelled_at") or entry["disconnected_at"])) * 1000
        for entry in entries
        if entry.get("aborted_at") and (entry.get("cancelled_at") or entry.get("disconnected_at"))
    ]
    return {
        "server.generations": len(entries),
        "server.tokens_generated": sum(int(e.get("completion_tokens") or 0) for e in entries),
        "server.tokens_wasted": sum(int(e.get("wasted_tokens") or 0) for e in entries),
        "server.background_left_running": sum(
            1
            for e in entries
            if e.get("background") and not e.get("cancelled_at") and e.get("wasted_tokens")
        ),
        "server.aborted": sum(1 for e in entries if e.get("finish_reason") == "abort"),
        "server.abort_latency_ms": latencies,
        "server.upstream_ttft_ms": [
            (e["first_token_at"] - e["received_at"]) * 1000
            for e in entries
            if e.get("first_token_at") and e.get("received_at")
        ],
    }


def _compatible(a: str, b: str) -> bool:
    """One text is a prefix of the other: they tell the same answer so far."""
    return a.startswith(b) or b.startswith(a)


def expected_text(
    entries: Sequence[Mapping[str, Any]],
    generations: Sequence[tuple[str, bool]],
    shown: str,
    from_ledger: bool,
) -> tuple[str | None, bool]:
    """What the client should have shown, and whether the upstream finished it.

    From the emulator's ledger: the planned text; when a sampling upstream drew
    different texts for the attempts of one request, the last one the shown text agrees
    with (else the last), since a restarted client ends on its last attempt. From a real
    server's bytes: the last finished generation; when none finished (abandoned, or cut
    by a fault), what the upstream had sent up to that point."""
    if from_ledger:
        planned = [str(e["planned_text"]) for e in entries if e.get("planned_text") is not None]
        if not planned:
            return None, True
        if len(set(planned)) == 1:
            return planned[0], True
        agreeing = [text for text in planned if _compatible(text, shown)]
        return (agreeing or planned)[-1], True
    done = [text for text, finished in generations if finished]
    if done:
        agreeing = [text for text in done if _compatible(text, shown)]
        return (agreeing or done)[-1], True
    if generations:
        return generations[-1][0], False
    return None, True


def judge_drawn(
    verdict: str,
    attempts: Sequence[str],
    finished: bool,
    shown: str,
    result: Mapping[str, Any] | None,
) -> str:
    """Refine a verdict with the text each attempt of the request got from the upstream
    (generated, by the ledger, or sent, by a real server's bytes), in order.

    `contradicted`: a sampling server (vLLM at temperature > 0 without a `seed`) draws
    a new answer for each retry. When two attempts disagree and an attempt's text
    disagrees with what the client ends on, the client showed one answer and then
    another: redrawn by a restart, or spliced by a resume at an offset. This is not
    `missing_tokens`: nothing was lost, what the user read was taken back (the seed
    article: "a naive retry can contradict what the user already read"). A real
    server's generation that never finished is not `complete` even when the client
    showed all it sent."""
    if verdict in ("hang", "abandoned") or result is None:
        return verdict
    if not finished and verdict == "complete":
        return "truncation_detected" if result.get("error") else "silent_truncation"
    disagree = any(not _compatible(a, b) for a, b in itertools.combinations(attempts, 2))
    if disagree and any(not _compatible(text, shown) for text in attempts):
        return "contradicted"
    return verdict


# ------------------------------------------------- server side, a real server


@dataclass(frozen=True)
class UpstreamExchange:
    """One request the proxy sent a real server, read from the journal's upstream leg:
    its body, when its first byte went up (wall clock), what came back (status, text,
    whether a finish_reason or `[DONE]` arrived), when each token's chunk arrived, and
    when the proxy closed the connection toward the server before the response ended:
    the moment the server could learn that its client had left (None when the response
    ended first)."""

    body: str
    sent_at: float
    status: int | None
    text: str
    finished: bool
    closed_at: float | None = None
    token_times: tuple[float, ...] = ()
    # A Responses-API exchange: `resume` (`GET /v1/responses/{id}`, reading a stored
    # response) and `cancel` (`POST /v1/responses/{id}/cancel`) start no generation; the
    # response it is about, and whether a create asked for `background`
    role: str = "generation"
    response_id: str | None = None
    background: bool = False


Sample = tuple[float, float, float]
"""One read of vLLM's /metrics: (wall time, `vllm:num_requests_running`,
`vllm:generation_tokens_total`)."""


def delivered_token_times(
    record: LegRecord, time_at: Callable[[Direction, int], float]
) -> list[float]:
    """When each token chunk of a framed client leg was written toward the client: what
    the path delivered to the client's socket, before the client's own reading (a client
    that holds a retried answer back and shows it whole lumps what the path did not).
    `time_at(direction, offset)` is the journal's wall time of the byte at that offset."""
    return [
        time_at(Direction.DOWNSTREAM, offset)
        for _, offset, meaning in _meanings(record)
        if meaning.token is not None
    ]


def delivered_tokens_per_burst(legs: Iterable[Sequence[float]]) -> float | None:
    """Token chunks per burst (BURST_GAP apart) as the path delivered them, over each
    connection's `delivered_token_times`; None when no leg showed a token chunk (a
    content-coded body, an HTTP/2 leg): then only the client's own view is known."""
    chunks = bursts = 0
    for times in legs:
        chunks += len(times)
        bursts += len(arrivals(times))
    return chunks / bursts if bursts else None


def exchanges_of(
    record: LegRecord, time_at: Callable[[Direction, int], float], closed_at: float | None
) -> list[UpstreamExchange]:
    """One connection's requests to a real server, from its framed upstream leg.
    `time_at(direction, offset)` is the wall time the byte at that stream offset crossed
    the leg (the journal's `time_at`); `closed_at` the proxy's first close toward the
    server (a FIN, an RST or a failed write), which only the connection's last request
    can meet before its response ended."""
    requests = [(m, offset) for m, offset, _, head in record.heads[Direction.UPSTREAM]]
    statuses: dict[int, int | None] = {}
    for message, _, _, head in record.heads[Direction.DOWNSTREAM]:
        if not head.is_interim:
            statuses.setdefault(message, head.status)
    streamed = _streamed(record)
    tokens: dict[int, list[float]] = {}
    for message, offset, meaning in _meanings(record):
        if meaning.token is not None:
            tokens.setdefault(message, []).append(time_at(Direction.DOWNSTREAM, offset))
    ended = {message for message, _ in record.ends[Direction.DOWNSTREAM]}
    last = requests[-1][0] if requests else None
    ids = response_ids(record)
    resumes = _resume_messages(record)
    targets = {m: head.target or "" for m, _, _, head in record.heads[Direction.UPSTREAM]}
    exchanges = []
    for message, offset in requests:
        text, done = streamed.get(message, ("", message in ended))
        body = record.request_body(message).decode("utf-8", "replace")
        cancelled = _CANCEL.search(urlsplit(targets.get(message, "")).path.rstrip("/"))
        role = "resume" if message in resumes else "cancel" if cancelled else "generation"
        exchanges.append(
            UpstreamExchange(
                body=body,
                sent_at=time_at(Direction.UPSTREAM, offset),
                status=statuses.get(message),
                text=text,
                finished=done,
                closed_at=closed_at if message == last and message not in ended else None,
                token_times=tuple(tokens.get(message, ())),
                role=role,
                response_id=cancelled.group(1) if cancelled else ids.get(message),
                background=_asks_background(body),
            )
        )
    return exchanges


_CANCEL = re.compile(r"/responses/([^/]+)/cancel$")


def _asks_background(body: str) -> bool:
    """The request body asks for a background Responses-API response."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("background") is True


@dataclass(frozen=True)
class _Generation:
    """One generation of a real server with every leg that read it: a response's create
    and its resumes (`GET /v1/responses/{id}`), the first cancel of it."""

    create: UpstreamExchange
    token_times: tuple[float, ...]
    finished: bool
    closed_at: float | None  # the proxy let go of its last leg before the response ended
    cancelled_at: float | None


def _generations(exchanges: Sequence[UpstreamExchange]) -> list[_Generation]:
    """The accepted generations in the order they were asked, each with the legs that
    read it: a resume or a cancel is part of the response it names, never a generation."""
    accepted = [e for e in exchanges if e.status is None or 200 <= e.status < 300]
    resumes: dict[str, list[UpstreamExchange]] = {}
    cancels: dict[str, float] = {}
    for exchange in accepted:
        if exchange.response_id is None:
            continue
        if exchange.role == "resume":
            resumes.setdefault(exchange.response_id, []).append(exchange)
        elif exchange.role == "cancel":
            before = cancels.get(exchange.response_id, exchange.sent_at)
            cancels[exchange.response_id] = min(before, exchange.sent_at)
    found = []
    for create in sorted((e for e in accepted if e.role == "generation"), key=lambda e: e.sent_at):
        named = create.response_id or ""
        legs = sorted([create, *resumes.get(named, [])], key=lambda leg: leg.sent_at)
        finished = any(leg.finished for leg in legs)
        found.append(
            _Generation(
                create=create,
                token_times=tuple(sorted(t for leg in legs for t in leg.token_times)),
                finished=finished,
                closed_at=None if finished else legs[-1].closed_at,
                cancelled_at=cancels.get(named),
            )
        )
    return found


def counter_at(samples: Sequence[Sample], when: float) -> float:
    """The generation-token counter at `when`, interpolated between the samples around it."""
    if not samples:
        return 0.0
    if when <= samples[0][0]:
        return samples[0][2]
    for (t0, _, c0), (t1, _, c1) in pairwise(samples):
        if t0 <= when <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)
    return samples[-1][2]


def _max_tokens(body: str) -> int | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    # chat, completions and Messages say max_tokens; the Responses API max_output_tokens
    value = parsed.get("max_tokens", parsed.get("max_output_tokens"))
    return value if isinstance(value, int) else None


def real_server_metrics(
    exchanges: Sequence[UpstreamExchange],
    samples: Sequence[Sample],
    client_left: Mapping[str, float],
    to_client: Mapping[str, ResponseAnswer] | None = None,
) -> dict[str, Any]:
    """`server.*` of a real vLLM, which keeps no ledger, from two sources that each
    see what the other cannot. The journal's upstream leg has the exact time each
    token's chunk reached the proxy and when the proxy let go of the server; vLLM's
    /metrics, sampled around the client, count every token generated, sent or not
    (vLLM answers /metrics slowly while it streams on a busy machine, hundreds of ms
    here, so the samples fix counts, not times). Clients run one at a time against a
    real server and a client's requests one after another, so the tokens counted
    between one request and the next are that request's (under concurrency only the
    totals stay exact).

    - generations: requests the server accepted (2xx, or no answer yet when cut).
    - tokens_generated: the counter's rise over each request's window.
    - aborted: a generation whose response had not ended when the proxy closed the
      connection and that stopped short of its `max_tokens`: vLLM stopped because the
      connection closed (vLLM 0.32 counts no `finished_reason="abort"`;
      docs/real-vllm.md). A natural end (EOS) would have sent its finish chunk.
    - abort_latency_ms: from that close to the last token: the last chunk read, or,
      when tokens were generated that never reached the proxy, the first sample that
      counted them all (then to within one sample).
    - tokens_wasted: tokens generated more than WASTE_SLACK after the client left (its
      `ended_at`, or the proxy's close when that came first): all it generated, less
      what had been generated by then (the chunks read by then, or the counter
      interpolated there when it says more), as `tokens_after` does with the emulator's
      token times.

    A Responses-API response read over several legs (its create and its resumes, `GET
    /v1/responses/{id}`) is one generation, timed from its create; a resume or a cancel
    starts none. A background response (`background: true`) is meant to outlive its
    client, so the proxy's close is neither its abort nor its client leaving while a
    later leg reads it to its end: its waste is what it made after the user gave up
    (`ended_at`), after its cancel (`POST /v1/responses/{id}/cancel`, which is also its
    abort, timed from the cancel), or after its last leg closed before its end (a
    restarting client left it for a new response). Such a response left running goes
    on into the later requests' windows: there, tokens counted beyond the chunks the
    later request read are its waste, up to its `max_output_tokens` (to within the steps
    vLLM streams no text for).

    `client_left` maps a request tag to when its client left (the result's `ended_at`).
    `to_client` (`response_answers` of the client leg) says what of a background response
    crossed the client leg, as `background_waste` reads it for the emulator: one whose end
    its client was never sent wasted what it made past what crossed, even where the proxy
    read it to its end (a handoff held the connection and then reset it, and the client
    created another), and it was left running for nobody.
    """
    ours = _generations(exchanges)
    out: dict[str, Any] = {
        "server.generations": len(ours),
        "server.tokens_generated": 0,
        "server.tokens_wasted": 0,
        "server.background_left_running": 0,
        "server.aborted": 0,
        "server.abort_latency_ms": [],
        "server.upstream_ttft_ms": [
            (g.create.token_times[0] - g.create.sent_at) * 1000
            for g in ours
            if g.create.token_times
        ],
    }
    if not samples:
        return out
    last = samples[-1][0]
    running = 0.0  # tokens an unwatched background response may still make
    for number, generation in enumerate(ours):
        exchange = generation.create
        end = ours[number + 1].create.sent_at if number + 1 < len(ours) else last
        final = counter_at(samples, end)
        base = counter_at(samples, exchange.sent_at)
        tokens = round(max(final - base, 0.0))
        out["server.tokens_generated"] += tokens
        unread = max(tokens - len(generation.token_times), 0)
        quiet_at_end = [s for s in samples if s[0] <= end][-1][1] == 0
        left = [t for tag, t in client_left.items() if tag in exchange.body]
        if generation.closed_at is not None:
            left.append(generation.closed_at)
        if generation.cancelled_at is not None:
            left.append(generation.cancelled_at)
        gone = min((t for t in left if t < end), default=None)
        wasted = 0
        if gone is not None:
            # counted by then: the chunks read by then, or the counter if it says more
            cutoff = gone + WASTE_SLACK
            read = sum(1 for t in generation.token_times if t <= cutoff)
            counted = max(counter_at(samples, cutoff) - base, read)
            wasted = max(tokens - round(counted), 0)
        if exchange.background and to_client is not None:
            # What crossed the client leg, as `background_waste` judges the emulator's: a
            # response whose end its client was sent wasted nothing; otherwise what it made
            # past what reached the client went to nobody, whether or not the proxy read it
            # to its end (a handoff's outage: the proxy read all of it, then reset the
            # client's connection, and the client created another).
            reached = to_client.get(exchange.response_id or "")
            if reached is None or reached.reason in (None, "cancelled"):
                wasted = max(wasted, tokens - (reached.token_events if reached else 0))
        # an earlier background response still running for nobody counted in this window
        spill = int(min(max(unread - wasted, 0), running))
        running -= spill
        out["server.tokens_wasted"] += wasted + spill
        limit = _max_tokens(exchange.body)
        if exchange.background:
            let_go = gone is not None and not generation.finished
            if let_go and generation.cancelled_at is None:
                running += float("inf") if limit is None else max(limit - tokens + spill, 0)
            if (let_go or wasted) and generation.cancelled_at is None:
                out["server.background_left_running"] += 1
            closed = generation.cancelled_at  # the close is no abort: the cancel is
        else:
            closed = generation.closed_at
        if closed is None or generation.finished or (limit is not None and tokens >= limit):
            continue  # ended first, or ran to its end: generated for nobody, not aborted
        if not quiet_at_end:
            continue  # still generating when sampling gave up: no abort seen
        stopped = max(generation.token_times, default=closed)
        if unread:
            all_counted = [t for t, _, c in samples if t >= closed and c >= final]
            stopped = max(stopped, min(all_counted, default=stopped))
        out["server.aborted"] += 1
        out["server.abort_latency_ms"].append(max(stopped - closed, 0.0) * 1000)
    return out


# ----------------------------------------------------------------------- all


def score_client(
    scenario: str,
    client: str,
    tags: list[str],
    result: Mapping[str, Any] | None,
    ledger: Sequence[Mapping[str, Any]],
    upstream_traffic: Sequence[UpstreamLeg],
    fault_reports: Iterable[tuple[str, str]],
    faults_declared: list[str],
    client_traffic: Sequence[UpstreamLeg] | None = None,
    *,
    no_result: bool = False,
) -> ClientScore:
    """Score one client's run of one scenario. `upstream_traffic` holds, per connection,
    the (request bytes, response bytes) seen on the upstream leg; `client_traffic` the
    same for the client leg, where attempts are counted (None: no journal of the client
    leg, so the client's own `attempts` is all there is). A `result` of None is a client
    that hung, or with `no_result` one that ended without a result to read."""
    score = ClientScore(scenario, client, faults_declared=faults_declared)
    results = {int(r["index"]): r for r in (result or {}).get("results", [])}
    all_entries: list[Mapping[str, Any]] = []
    timings: dict[str, list[float]] = {
        "client.perceived_ttft_ms": [],
        "client.itl_ms": [],
        "client.stall_detect_ms": [],
    }
    bursts = 0
    largest_gap = 0.0
    unseen_waste = 0
    reached = 0  # tokens generated while the client was still there (observe.requests)
    # A background response's waste is judged by what reached its client (`background_waste`)
    to_client = response_answers(client_traffic) if client_traffic is not None else {}
    ledger = [judged_entry(entry, to_client) for entry in ledger]
    # With no emulator ledger (a real server), the upstream's own bytes say what it sent.
    sent = [] if ledger else upstream_generations(upstream_traffic)
    reasons_sent = [] if ledger else upstream_finish_reasons(upstream_traffic)
    for index, tag in enumerate(tags):
        entries = ledger_for(ledger, tag)
        all_entries.extend(entries)
        generations = [(text, done) for body, text, done in sent if tag in body]
        ended_at = (results.get(index) or {}).get("ended_at")
        left_at = None if ended_at is None else float(ended_at)
        by_ledger = sum(int(e.get("wasted_tokens") or 0) for e in entries)
        unseen_waste += tokens_wasted(entries, left_at) - by_ledger
        reached += tokens_reached(entries, left_at)
        request_result = results.get(index)
        shown_text = str((request_result or {}).get("text") or "")
        drawn = [str((e.get("texts") or [""])[0]) for e in entries]
        if not ledger:
            drawn = [text for text, _ in generations]
        expected, finished = expected_text(entries, generations, shown_text, bool(ledger))
        verdict = "no_result" if no_result else request_verdict(expected, request_result)
        verdict = judge_drawn(verdict, drawn, finished, shown_text, request_result)
        if verdict == "complete_then_error" and not finished:
            verdict = "truncation_detected"  # all it had sent, but it was cut
        # a real server that refused every attempt streamed nothing to judge the client by
        refused = None if ledger else refused_by_upstream(upstream_statuses(upstream_traffic, tag))
        if refused is not None:
            verdict = "upstream_error"
        reported = (request_result or {}).get("attempts")
        reported_attempts = int(reported) if reported is not None else None
        if client_traffic is not None:
            attempts = wire_attempts(client_traffic, tag)
        else:
            attempts = reported_attempts or 0
        if ledger:
            upstream_reason = entries[-1].get("finish_reason") if entries else None
        else:
            ours = [reason for body, reason in reasons_sent if tag in body]
            upstream_reason = ours[-1] if ours else None
        client_reason = (request_result or {}).get("finish_reason")
        delivered = [] if client_traffic is None else delivered_finish_reasons(client_traffic, tag)
        reached_here = reached_reason(delivered, upstream_reason, verdict)
        gaps, repeats = (0, 0) if client_traffic is None else sequence_faults(client_traffic, tag)
        score.requests.append(
            RequestScore(
                index=index,
                verdict=verdict,
                expected_chars=len(expected or ""),
                shown_chars=len((request_result or {}).get("text") or ""),
                attempts=attempts,
                generations=len(entries) if ledger else len(generations),
                error=(request_result or {}).get("error"),
                reported_attempts=reported_attempts,
                finish_reason=client_reason,
                upstream_finish_reason=upstream_reason,
                reached_finish_reason=reached_here,
                finish_flag=finish_flag(client_reason, reached_here, request_result),
                expected_digest=_digest(expected or ""),
                shown_digest=_digest(shown_text),
                upstream_split=",".join(map(str, upstream_split(upstream_traffic, tag))),
                sequence_gaps=gaps,
                sequence_repeats=repeats,
                upstream_status=refused,
            )
        )
        if request_result is not None:
            shown = display_metrics(request_result)
            if "ttft_ms" in shown:
                timings["client.perceived_ttft_ms"].append(shown["ttft_ms"])
            timings["client.itl_ms"].extend(shown["itl_ms"])
            if "stall_detect_ms" in shown and verdict == "truncation_detected":
                timings["client.stall_detect_ms"].append(shown["stall_detect_ms"])
            bursts += shown["bursts"]
            largest_gap = max(largest_gap, shown["largest_gap_ms"])

    # agent verdicts replace text verdicts they see past (a cut tool call has no text)
    agent = judge_agents(score.requests, tags, results, upstream_traffic, client_traffic)
    verdicts = [request.verdict for request in score.requests]
    flags = [request.finish_flag for request in score.requests]
    mismatched = [
        request
        for request in score.requests
        if client_traffic is not None
        and request.reported_attempts is not None
        and request.reported_attempts != request.attempts
    ]
    score.notes = [
        f"request {request.index}: the client reported {request.reported_attempts} "
        f"attempt(s), the wire shows {request.attempts}"
        for request in mismatched
    ]
    metrics: dict[str, Any] = {
        "client.requests": len(tags),
        "client.complete": verdicts.count("complete"),
        "client.complete_then_error": verdicts.count("complete_then_error"),
        "client.silent_truncations": verdicts.count("silent_truncation"),
        "client.truncations_detected": verdicts.count("truncation_detected"),
        "client.errors_reported": verdicts.count("error_reported"),
        "client.duplicated": verdicts.count("duplicated"),
        "client.missing_tokens": verdicts.count("missing_tokens"),
        "client.mojibake": verdicts.count("mojibake"),
        "client.contradicted": verdicts.count("contradicted"),
        "client.hangs": verdicts.count("hang"),
        "client.abandoned": verdicts.count("abandoned"),
        "client.resumed": sum(int(r.get("resumes") or 0) for r in results.values()),
        "client.retries": sum(max(request.attempts - 1, 0) for request in score.requests),
        "client.amplification": max((request.attempts for request in score.requests), default=0),
        "client.attempts_mismatch": len(mismatched),
        "client.length_hidden": flags.count("length_hidden"),
        "client.stop_invented": flags.count("stop_invented"),
        "client.sequence_gaps": sum(request.sequence_gaps for request in score.requests),
        "client.sequence_repeats": sum(request.sequence_repeats for request in score.requests),
        "server.generations_per_request": max(
            (request.generations for request in score.requests), default=0
        ),
        "client.largest_gap_ms": largest_gap,
        "client.bursts": bursts,
        **timings,
        **agent,
    }
    metrics.update(server_metrics(all_entries))
    metrics["server.tokens_wasted"] += unseen_waste
    # only what could reach the client: tokens generated after it left are in no burst
    metrics["client.tokens_per_burst"] = (reached / bursts) if bursts else 0.0
    own_lumps = upstream_tokens_per_burst(all_entries)
    if own_lumps is not None:
        metrics[SERVER_TOKENS_PER_BURST] = own_lumps
    upstream = {"heartbeats": 0, "usage_reported": 0, "inband_errors": 0, "x_accel_buffering_no": 0}
    for leg in upstream_traffic:
        for key, value in analyse_upstream_leg(_framed(leg)).items():
            upstream[key] += value
    metrics.update({f"server.{key}": value for key, value in upstream.items()})
    score.metrics = metrics
    score.faults_fired = sorted({f"{fault}:{action}" for fault, action in fault_reports})
    return score


# ----------------------------------------------------------------------- expect


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = min(round(fraction * (len(ordered) - 1)), len(ordered) - 1)
    return ordered[position]


def _aggregate(value: Any, condition: str) -> Any:
    if not isinstance(value, list):
        return value
    if condition == "mean_max":
        return statistics.fmean(value) if value else 0.0
    if condition.startswith("p") and condition.endswith("_max"):
        return percentile(value, int(condition[1:3]) / 100)
    if condition == "min":
        return min(value, default=0.0)
    return max(value, default=0.0)


def check_one(name: str, rule: Any, metrics: Mapping[str, Any]) -> list[Check]:
    actual = metrics.get(name)
    rules = rule if isinstance(rule, dict) else {"equals": rule}
    checks = []
    for condition, expected in rules.items():
        value = _aggregate(actual, condition)
        if condition == "equals":
            passed = value == expected
        elif condition == "min":
            passed = value is not None and value >= expected
        else:  # max and every *_max
            passed = value is not None and value <= expected
        if isinstance(value, float):
            value = round(value, 2)
        checks.append(Check(name, condition, expected, value, passed))
    return checks


def evaluate_expect(
    expect: Mapping[str, Any], client: str, metrics: Mapping[str, Any], clients: Iterable[str]
) -> list[Check]:
    """Checks for one client. Top-level names say what a correct client achieves and apply
    to every client; a `CLIENT: {...}` block overrides those names for one client (the
    library uses it to pin down how each built-in client is known to behave)."""
    known_clients = set(clients)
    rules = {key: rule for key, rule in expect.items() if key not in known_clients}
    own = expect.get(client)
    if client in known_clients and isinstance(own, Mapping):
        rules.update(own)
    checks: list[Check] = []
    for name, rule in rules.items():
        checks += check_one(name, rule, metrics)
    return checks
