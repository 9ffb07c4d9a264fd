"""`middlebox fingerprint URL` against a real OpenAI-compatible LLM server, not the probe.

When the probe upstream cannot be deployed behind the path, the front door's own server is
measured with real chat completions (bounded: STREAMS streams of MAX_TOKENS, one with
`Accept-Encoding: gzip`, one long one the client leaves; `--budget` bounds them all):
each read is timed on a raw socket and handed to the pure measures in
middlebox/scenario/fingerprint_llm.py. With `--direct URL` (the server without the path)
the same measures are taken there, and what the path adds is the difference; the response
headers are compared between the two. Cancellation is read from the server's Prometheus
`/metrics` (`--metrics-url URL`; by default the direct URL's, else the front door's, origin
+ `/metrics`): `vllm:num_requests_running` back to its level before the request.

The front door is taken for an LLM server when `--model NAME` is given, or when its
`GET .../v1/models` lists models and not the probe's (`middlebox-probe`). What needs the
probe's shape control is listed as not measured, with why; `--write` is refused before
anything is sent: a scenario is fitted from the probe's measures (docs/fingerprint.md).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from middlebox.scenario import fingerprint as probe_measures
from middlebox.scenario import fingerprint_llm as measures
from middlebox.scenario.fingerprint import Read, Response
from middlebox.tools.fingerprint import FingerprintError, Target, _get_json, _receive
from middlebox.tools.probe_upstream import MODEL as PROBE_MODEL

STREAMS = 3  # plain streams per target: the spread across them is the uncertainty
MAX_TOKENS = 64
# `ignore_eos` makes vLLM generate all of them; a server that refuses it (400) is asked
# again without it
CANCEL_MAX_TOKENS = 4096  # long enough that a client leaves well before the end
LEAVE_AFTER_EVENTS = 10
LEAVE_AFTER_S = 3.0  # a path that holds the stream shows the client nothing for a while
STOP_WAIT = 10.0  # seconds /metrics is watched after the leave
SAMPLE_PERIOD = 0.02
STREAM_LIMIT = 30.0
MIN_LEFT = 3.0  # seconds of budget a measure needs to start
PROMPT = "Count from one to two hundred, one number a line."
GZIP = (("Accept-Encoding", "gzip"),)


def _models_path(target: Target) -> str:
    return target.chat.removesuffix("/chat/completions") + "/models"


def served_model(url: str, model: str | None) -> str | None:
    """The model to ask when `url` is a real LLM server (`model` when given), None when it
    is the probe upstream or does not list models (the probe's measures then say why)."""
    if model is not None:
        return model
    target = Target.parse(url)
    status, found = _get_json(target, _models_path(target), 5.0)
    if status != 200 or not isinstance(found, dict) or not isinstance(found.get("data"), list):
        return None
    ids = [str(m.get("id")) for m in found["data"] if isinstance(m, dict) and m.get("id")]
    if not ids or PROBE_MODEL in ids:
        return None
    return ids[0]


def _request(target: Target, body: dict[str, Any], headers: tuple[tuple[str, str], ...]) -> bytes:
    data = json.dumps(body).encode()
    head = [f"POST {target.chat} HTTP/1.1", f"Host: {target.host_header}",
            "Content-Type: application/json", "Accept: text/event-stream",
            f"Content-Length: {len(data)}", "Connection: close"]  # fmt: skip
    head += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data


def _body(model: str, max_tokens: int, *, whole: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": PROMPT}],
    }  # fmt: skip
    if whole:
        # vLLM's sampling parameter: all max_tokens are generated, so every stream has the
        # same length and a client that leaves does so mid-stream
        body["ignore_eos"] = True
    return body


def _stream(
    target: Target,
    request: bytes,
    limit: float,
    leave: Callable[[Response, float], bool] | None = None,
) -> tuple[Response, socket.socket | None]:
    """The response to `request`, read to its end (or `limit` seconds); with `leave`, the
    reading stops once it says so and the socket comes back open for the caller to close."""
    decoder = probe_measures.Decoder()
    sock = target.connect(min(limit, 10.0))
    start = time.monotonic()
    deadline = start + limit
    try:
        sock.sendall(request)
        ended = False
        while (data := _receive(sock, deadline)) is not None:
            if not data:
                ended = True
                break
            response = decoder.feed(Read(round(time.monotonic() - start, 6), data))
            if leave is not None and leave(response, time.monotonic() - start):
                return response, sock
            if response.complete:
                break
    except OSError as error:
        sock.close()
        raise FingerprintError(
            f"{target.url}: the connection failed while streaming ({error.strerror or error}): "
            f"run again; if it repeats, the path refuses the requests"
        ) from None
    sock.close()
    return (decoder.eof() if ended else decoder.response), None


def _check(target: Target, response: Response) -> None:
    kind = response.header("content-type") or "no content type"
    if response.status != 200 or not kind.startswith("text/event-stream"):
        said = bytes(response.body[:200]).decode("utf-8", "replace").replace("\n", " ")
        raise FingerprintError(
            f"{target.url}: POST {target.chat} answered {response.status or 'nothing'} "
            f"({kind}) {said!r}, not an event stream: check the URL and --model"
        )


class Scraper:
    """The server's /metrics on one keep-alive connection."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        https = parts.scheme == "https"
        kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
        self.url, self.path = url, parts.path or "/metrics"
        self.connection = kind(parts.hostname or "127.0.0.1", parts.port, timeout=2.0)

    def text(self) -> tuple[int | None, str]:
        try:
            self.connection.request("GET", self.path)
            answer = self.connection.getresponse()
            return answer.status, answer.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            self.connection.close()  # reconnects on the next request
            return None, ""

    def sample(self) -> tuple[float, float, float] | None:
        """(time, requests running, generation tokens), None when the gauge is missing."""
        _, text = self.text()
        running = measures.metric(text, measures.RUNNING)
        if running is None:
            return None
        return time.monotonic(), running, measures.metric(text, measures.GENERATED) or 0.0

    def close(self) -> None:
        self.connection.close()


def metrics_url(url: str, direct: str | None, metrics: str | None) -> str:
    """`--metrics-url`, else the origin of --direct (the server itself), else the front door's."""
    if metrics:
        return metrics
    parts = urlsplit(direct or url)
    return f"{parts.scheme}://{parts.netloc}/metrics"


class Session:
    """One target's measures: the budget, the progress line, what was not measured."""

    def __init__(self, target: Target, model: str, budget: float,
                 progress: Callable[[str], None]) -> None:  # fmt: skip
        self.target, self.model, self.progress = target, model, progress
        self.deadline = time.monotonic() + budget
        self.not_measured: list[str] = []
        self.whole = True  # asks with `ignore_eos` until the server refuses it (not vLLM)

    def limit(self, what: str) -> float | None:
        left = self.deadline - time.monotonic()
        if left < MIN_LEFT:
            self.not_measured.append(f"{what} (the budget ran out)")
            return None
        return min(left, STREAM_LIMIT)

    def plain(self, what: str, headers: tuple[tuple[str, str], ...] = ()) -> Response | None:
        limit = self.limit(what)
        if limit is None:
            return None
        self.progress(f"measuring {what} ({MAX_TOKENS} tokens from {self.model})")
        request = _request(self.target, _body(self.model, MAX_TOKENS, whole=self.whole), headers)
        response, _ = _stream(self.target, request, limit)
        if response.status == 400 and self.whole:  # a server without vLLM's ignore_eos
            self.whole = False
            return self.plain(what, headers)
        _check(self.target, response)
        return response

    def cancel(self, scraper: Scraper) -> dict[str, Any] | None:
        """A long stream the client leaves after LEAVE_AFTER_EVENTS token events (or
        LEAVE_AFTER_S), with /metrics sampled before, at and after the leave."""
        limit = self.limit("cancellation")
        if limit is None:
            return None
        first = scraper.sample()
        if first is None:
            status, _ = scraper.text()
            self.not_measured.append(
                f"cancellation (no {measures.RUNNING} at {scraper.url}, got "
                f"{status or 'no answer'}: give the server's /metrics with --metrics-url URL)"
            )
            return None
        self.progress(f"measuring cancellation (a client that leaves; {scraper.url})")
        samples = [first]

        def leave(response: Response, elapsed: float) -> bool:
            events = len(measures.token_events(response))
            return events >= LEAVE_AFTER_EVENTS or elapsed >= min(LEAVE_AFTER_S, limit / 3)

        body = _body(self.model, CANCEL_MAX_TOKENS, whole=self.whole)
        request = _request(self.target, body, ())
        response, sock = _stream(self.target, request, limit, leave)
        if sock is None:
            self.not_measured.append(
                f"cancellation (the long stream ended before the client left: answered "
                f"{response.status}, {len(measures.token_events(response))} token events)"
            )
            return None
        if (during := scraper.sample()) is not None:
            samples.append(during)
        sock.close()
        left_at = time.monotonic()
        wait = max(min(STOP_WAIT, self.deadline - left_at), 0.5)
        while time.monotonic() - left_at < wait:
            if (sample := scraper.sample()) is not None:
                samples.append(sample)
                if sample[1] <= first[1]:
                    break
            time.sleep(SAMPLE_PERIOD)  # the server's progress, polled
        return measures.cancellation(samples, left_at, time.monotonic() - left_at)


def measure(
    target: Target, model: str, budget: float, metrics: str, progress: Callable[[str], None]
) -> tuple[dict[str, Any], list[str], list[list[str]]]:
    """One target's measures, what it could not measure, and its first response's headers."""
    session = Session(target, model, budget, progress)
    found: dict[str, Any] = {}
    runs: list[Response] = []
    for index in range(STREAMS):
        response = session.plain(f"a stream ({index + 1} of {STREAMS})")
        if response is not None:
            runs.append(response)
    headers = [list(field) for field in runs[0].headers] if runs else []
    if runs:
        found["stream"] = measures.streams([measures.stream(r) for r in runs])
        squeezed = session.plain("compression (Accept-Encoding: gzip)", GZIP)
        if squeezed is not None:
            decoded = probe_measures.decoded(squeezed)
            as_decoded = (
                measures.stream(decoded)
                if decoded is not None
                else {"events": 0, "complete": False, "bursts": []}
            )
            found["compression"] = measures.compression(
                runs[0], squeezed, found["stream"]["runs"][0], as_decoded
            )
    scraper = Scraper(metrics)
    try:
        cancel = session.cancel(scraper)
    finally:
        scraper.close()
    if cancel is not None:
        found["cancel"] = cancel
    return found, session.not_measured, headers


def fingerprint(
    url: str,
    *,
    model: str,
    direct: str | None = None,
    budget: float = 60.0,
    metrics: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The fingerprint document of the path at `url` in front of a real LLM server serving
    `model` (and of `direct`, the server without the path, when given)."""
    target = Target.parse(url)
    baseline = Target.parse(direct) if direct else None
    scrape = metrics_url(url, direct, metrics)
    share = budget / 2 if baseline else budget
    found, missing, headers = measure(target, model, share, scrape, progress)
    document: dict[str, Any] = {"url": url, "server": "llm", "model": model,
                                "metrics": scrape, "measures": found}  # fmt: skip
    if baseline is not None:
        progress(f"baseline: the same measures at {direct}")
        there, missed, own = measure(baseline, model, share, scrape, progress)
        document["direct"] = {"url": direct, "measures": there,
                              "not_measured": missed}  # fmt: skip
        if headers and own:
            found["response_headers"] = probe_measures.header_changes(
                measures.stable_headers(own), measures.stable_headers(headers)
            )
        if "stream" in found and "stream" in there:
            document["path_adds"] = measures.path_adds(found["stream"], there["stream"])
    else:
        missing.append(
            "the headers the path adds, removes or changes, and what it adds to the stream "
            "(they need --direct URL: the server without the path)"
        )
    document["not_measured"] = [*missing, *measures.UNMEASURABLE]
    document["summary"] = measures.summary(document)
    return document


def refuse_write() -> FingerprintError:
    """Why `--write` cannot fit a scenario against an LLM server, as the error to raise."""
    return FingerprintError(
        "--write fits a scenario from the probe upstream's measures (a hold's size or timer, "
        "the timeouts), which a real LLM server cannot give: run without --write for what "
        "it can measure, or deploy `middlebox probe-upstream` (docs/fingerprint.md)"
    )


def fingerprint_and_say(
    url: str,
    *,
    model: str,
    direct: str | None,
    budget: float,
    metrics: str | None,
    progress: Callable[[str], None],
    say: Callable[[str], None],
) -> dict[str, Any]:
    """`middlebox fingerprint` against an LLM server: measure, then `say` the summary."""
    document = fingerprint(url, model=model, direct=direct, budget=budget, metrics=metrics,
                           progress=progress)  # fmt: skip
    for line in document["summary"]:
        say(line)
    return document
