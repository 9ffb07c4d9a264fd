"""What one stream shows, in words: buffering, coalescing, a stall, a cut, a lost cancellation.

Pure: a stream's facts (when each token reached each side, the terminal marks, how each side
ended) and `now` come in, findings go out; the tests run it on a virtual clock. The burst rule
is the scorer's (`observe.requests.arrivals`: pieces BURST_GAP apart form one burst) and the
lumpiness threshold the diagnosis's (`report.diagnosis.LUMPY_TOKENS_PER_BURST`), so the page
and the scorecard call the same stream lumpy.

vLLM flushes every token as its own SSE event, so a direct stream reaches the client one
token per burst; a hop that holds tokens shows as the client's side arriving in fewer,
bigger bursts than the upstream's:
- buffering: lumps that start late (the client's first token LATE_FIRST_TOKEN_MS after the
  upstream's: nginx's proxy_buffering holds the response, head included, until a 4 KiB
  buffer fills or the upstream ends) or one lump with most of the answer, or, live, tokens
  the upstream sent that the client has not had for HELD_FOR;
- coalescing: lumps of several tokens that start on time (a proxy flushing on a short
  timer, as HAProxy's 60 ms window does);
- a stall: an open stream without a terminal mark where nothing moved on either side for
  STALL_AFTER;
- a cut: the client's side ended (FIN, RST, a failed write) before the terminal mark while
  the client was still reading;
- a lost cancellation: the client left before the terminal mark and the upstream kept
  generating for CANCEL_GRACE (nothing told it to stop: vLLM aborts a request only when its
  connection closes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from middlebox.observe.requests import BURST_GAP, arrivals
from middlebox.report.diagnosis import LATE_FIRST_TOKEN_MS, LUMPY_TOKENS_PER_BURST

# Nothing on either side of an open, unfinished stream for this long is a stall (vLLM
# streams a token every 10-100 ms; a pause of seconds is no model's inter-token latency).
STALL_AFTER = 2.0
# Tokens the upstream sent that the client has not had for this long are being held.
HELD_FOR = 0.5
# Upstream tokens still arriving this long after the client left: nobody cancelled it.
CANCEL_GRACE = 1.0
# One lump carrying at least this share of the answer is a buffer's release, not a timer's.
BUFFERED_SHARE = 0.5

KINDS = ("buffering", "coalescing", "stall", "cut", "lost cancellation")
# End kinds (the journal's, docs/observability.md) on the client leg toward the client.
CLOSED_TOWARD_CLIENT = frozenset({"sent_fin", "sent_rst", "write_failed"})
# ... and the client leaving (its own FIN or RST).
CLIENT_LEFT = frozenset({"read_fin", "read_rst"})


@dataclass(frozen=True)
class Side:
    """One side of a stream: when each token arrived there (sorted), whether its terminal
    mark ([DONE], message_stop, a terminal Responses event) was seen, and its bytes.
    `bursts`: how many bursts `tokens` form (`arrivals`), when the caller counted them as
    the tokens came (`count_bursts`); None: counted here."""

    tokens: tuple[float, ...] = ()
    done: bool = False
    first_byte: float | None = None
    last_byte: float | None = None
    bytes: int = 0
    bursts: int | None = None


@dataclass(frozen=True)
class StreamFacts:
    """A stream's two sides: `upstream` as the proxy read it from the server, `client` as
    it wrote it to the client. `client_end`: how the proxy's side toward the client ended
    (sent_fin, sent_rst, write_failed) and when; `client_left`: when the client closed or
    reset its own side; `upstream_closed`: when the upstream leg ended (either way)."""

    started: float
    upstream: Side = field(default_factory=Side)
    client: Side = field(default_factory=Side)
    client_end: tuple[str, float] | None = None
    client_left: float | None = None
    upstream_closed: float | None = None


@dataclass(frozen=True)
class Finding:
    kind: str
    words: str


def tokens_per_burst(times: tuple[float, ...]) -> float | None:
    bursts = len(arrivals(times))
    return len(times) / bursts if bursts else None


def count_bursts(bursts: int | None, last: float | None, at: float) -> int | None:
    """The bursts sorted times form once `at` follows `last` (`arrivals`' rule, one token at
    a time); None once they are not sorted (`arrivals` sorts them: count afresh)."""
    if bursts is None or last is None:
        return 1 if bursts is not None else None
    if at < last:
        return None
    return bursts + 1 if at - last > BURST_GAP else bursts


def _per_burst(side: Side) -> float | None:
    if side.bursts is None:
        return tokens_per_burst(side.tokens)
    return len(side.tokens) / side.bursts if side.bursts else None


def largest_gap(times: tuple[float, ...], start: float) -> float | None:
    """The longest wait between tokens on one side, the first counted from `start`."""
    if not times:
        return None
    previous, largest = start, 0.0
    for at in times:
        largest = max(largest, at - previous)
        previous = at
    return largest


def ttft(side: Side, start: float) -> float | None:
    return side.tokens[0] - start if side.tokens else None


def ending(facts: StreamFacts) -> str | None:
    """How the stream ended toward the client: complete, truncated (a FIN before the
    terminal mark), RST, or None while it is open."""
    if facts.client_end is None:
        if facts.client_left is not None and not facts.client.done:
            return "client left"
        return "complete" if facts.client.done and facts.upstream_closed is not None else None
    kind = facts.client_end[0]
    if facts.client.done:
        return "complete"
    if kind == "sent_rst":
        return "RST"
    if kind == "write_failed":
        return "write failed"
    return "truncated (FIN)" if facts.client.tokens or facts.upstream.tokens else "FIN"


def classify(facts: StreamFacts, now: float) -> list[Finding]:
    """Each thing the stream shows, most telling first; none for a smooth, whole stream."""
    found: list[Finding] = []
    lost = _lost_cancellation(facts, now)
    if lost:
        found.append(lost)
    cut = _cut(facts)
    if cut and not lost:
        found.append(cut)
    held = _held(facts, now) or _lumps(facts)
    if held:
        found.append(held)
    stall = _stall(facts, now)
    if stall:
        found.append(stall)
    return found


def _lost_cancellation(facts: StreamFacts, now: float) -> Finding | None:
    left = facts.client_left
    if left is None or facts.client.done or (facts.upstream.done and _before(facts, left)):
        return None
    after = [t for t in facts.upstream.tokens if t > left]
    upstream_open_for = (facts.upstream_closed or now) - left
    if upstream_open_for < CANCEL_GRACE:
        return None
    return Finding(
        "lost cancellation",
        f"lost cancellation: the client left at {left - facts.started:.2f} s and the upstream "
        f"kept generating for {upstream_open_for:.1f} s ({len(after)} tokens nobody reads)",
    )


def _before(facts: StreamFacts, left: float) -> bool:
    """The upstream had finished before the client left (nothing to cancel)."""
    return bool(facts.upstream.tokens) and facts.upstream.tokens[-1] <= left


def _cut(facts: StreamFacts) -> Finding | None:
    if facts.client_end is None or facts.client.done:
        return None
    kind, at = facts.client_end
    if facts.client_left is not None and facts.client_left <= at:
        return None  # the client hung up first: not the path's cut
    how = {"sent_rst": "an RST", "sent_fin": "a FIN", "write_failed": "a failed write"}[kind]
    upstream_had = len(facts.upstream.tokens)
    return Finding(
        "cut",
        f"cut: the client's stream ended with {how} at {at - facts.started:.2f} s after "
        f"{len(facts.client.tokens)} of the upstream's {upstream_had} tokens, no terminal "
        "event",
    )


def _held(facts: StreamFacts, now: float) -> Finding | None:
    """Live: tokens the upstream sent that the client has not had for HELD_FOR."""
    up, client = facts.upstream.tokens, facts.client.tokens
    if facts.client_end is not None or facts.client_left is not None or len(up) <= len(client):
        return None
    oldest_unseen = up[len(client)]
    if now - oldest_unseen < HELD_FOR:
        return None
    return Finding(
        "buffering",
        f"buffering: the path holds {len(up) - len(client)} tokens the upstream sent; the "
        f"oldest {now - oldest_unseen:.1f} s ago",
    )


def _lumps(facts: StreamFacts) -> Finding | None:
    """Afterwards: the client's tokens in fewer, bigger bursts than the upstream sent them."""
    client = facts.client.tokens
    per_burst = _per_burst(facts.client)
    source = _per_burst(facts.upstream) or 1.0
    if per_burst is None or per_burst < LUMPY_TOKENS_PER_BURST or source >= LUMPY_TOKENS_PER_BURST:
        return None
    bursts = arrivals(client)
    biggest = max(
        sum(1 for t in client if start <= t < end)
        for start, end in zip(bursts, [*bursts[1:], float("inf")], strict=True)
    )
    late_ms = 1000 * (
        (ttft(facts.client, facts.started) or 0) - (ttft(facts.upstream, facts.started) or 0)
    )
    if biggest >= BUFFERED_SHARE * len(client) or late_ms >= LATE_FIRST_TOKEN_MS:
        return Finding(
            "buffering",
            f"buffering: the client's first token came {late_ms:.0f} ms after the upstream's, "
            f"then {len(client)} tokens in {len(bursts)} lumps (the largest {biggest})",
        )
    return Finding(
        "coalescing",
        f"coalescing: the client got the tokens in {len(bursts)} lumps of ~{per_burst:.0f} "
        f"(the upstream sent ~{source:.0f} a burst)",
    )


def _stall(facts: StreamFacts, now: float) -> Finding | None:
    if facts.client_end is not None or facts.client_left is not None or facts.client.done:
        return None
    if facts.upstream.done and facts.upstream_closed is not None:
        return None
    moved = [
        t
        for t in (facts.started, facts.upstream.last_byte, facts.client.last_byte)
        if t is not None
    ]
    quiet = now - max(moved)
    if quiet < STALL_AFTER:
        return None
    return Finding(
        "stall",
        f"stall: nothing on either side for {quiet:.1f} s and no terminal event "
        f"({len(facts.client.tokens)} tokens so far)",
    )
