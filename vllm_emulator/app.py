"""The emulator's HTTP server (aiohttp, asyncio): vLLM's routes over the pure core.

One `Engine` owns the pure `Scheduler` and wakes itself with a loop timer at the
scheduler's next deadline; every due token is applied at once to its request
(ledger, metrics, frames). HTTP handlers only write frames: one `resp.write()`
per frame, so each frame is its own HTTP/1.1 chunk, as Starlette's
StreamingResponse does with each `yield` of vLLM's generator. A handler that
falls behind gets several tokens merged into one chunk, as vLLM's
RequestOutputCollector merges DELTA outputs when the API consumer lags.

Disconnects (reference §3): the server runs with aiohttp's handler cancellation,
so a client that closes, resets or half-closes (aiohttp, like uvicorn, lets the
transport close on EOF) cancels its handler at once, even while the request is
queued or in prefill; the engine then aborts its sequences within the same loop
turn and frees their KV blocks. `abort_on_disconnect: false` keeps generating to
the end for nobody, and the ledger counts those tokens as wasted.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import itertools
import json
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError

from vllm_emulator import textgen, wire
from vllm_emulator.config import EmulatorConfig
from vllm_emulator.metrics import (
    FINISH_REASONS,
    ITL_BUCKETS,
    LATENCY_BUCKETS,
    TTFT_BUCKETS,
    Registry,
    token_buckets,
)
from vllm_emulator.schedule import Admitted, KeepAlive, Pause, Scheduler, TimingModel, Token
from vllm_emulator.validation import ApiError, ParsedRequest, parse
from vllm_emulator.wire import Choice, Endpoint, StreamEncoder, Usage

PREFIX_QUERIES_HELP = "Prefix cache queries, in terms of number of queried tokens."
PREFIX_HITS_HELP = "Prefix cache hits, in terms of number of cached tokens."

# ----------------------------------------------------------------------- ledger


@dataclass
class LedgerEntry:
    """One request as the scorer sees it (the contract is in docs/emulator.md)."""

    request_id: str
    endpoint: Endpoint
    model: str | None
    stream: bool
    prompt: Any
    prompt_tokens: int
    max_tokens: int | None
    received_at: float
    id: str | None = None
    stream_id: str | None = None
    n: int = 1
    first_token_at: float | None = None
    finished_at: float | None = None
    planned_text: str | None = None
    planned_texts: list[str] = field(default_factory=list)
    planned_tokens: int = 0
    completion_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    bytes_written: int = 0
    write_times: list[float] = field(default_factory=list)
    delivered_tokens: int = 0
    disconnected_at: float | None = None
    aborted_at: float | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    status: int | None = None
    resumed_from: int | None = None
    resumes: int = 0
    cassette: bool = False
    texts: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        wasted = 0
        if self.disconnected_at is not None:
            wasted = max(0, self.completion_tokens - self.delivered_tokens)
        return {
            "request_id": self.request_id,
            "id": self.id,
            "endpoint": self.endpoint,
            "model": self.model,
            "stream": self.stream,
            "prompt": self.prompt,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "n": self.n,
            "received_at": self.received_at,
            "first_token_at": self.first_token_at,
            "finished_at": self.finished_at,
            "planned_text": self.planned_text,
            "planned_texts": self.planned_texts,
            "planned_tokens": self.planned_tokens,
            "text": self.texts[0]
            if self.texts
            else ("" if self.planned_text is not None else None),
            "texts": self.texts,
            "completion_tokens": self.completion_tokens,
            "token_times": self.token_times,
            "bytes_written": self.bytes_written,
            "write_times": self.write_times,
            "delivered_tokens": self.delivered_tokens,
            "disconnected_at": self.disconnected_at,
            "aborted_at": self.aborted_at,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "wasted_tokens": wasted,
            "status": self.status,
            "stream_id": self.stream_id,
            "resumed_from": self.resumed_from,
            "resumes": self.resumes,
            "cassette": self.cassette,
        }


# -------------------------------------------------------------------------- jobs

Frame = tuple[int, bytes, int]  # (event id, bytes, tokens delivered once written)


@dataclass
class Job:
    """A request in the engine: its plans, progress and the frames it produced."""

    entry: LedgerEntry
    request: ParsedRequest
    plans: list[textgen.Plan]
    seq_ids: list[str]
    arrival: float  # loop time
    encoder: StreamEncoder | None
    produced: list[int] = field(default_factory=list)
    encoded: list[int] = field(default_factory=list)
    last_token_time: list[float | None] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # choice of each unencoded token
    state: str = "running"  # running | finished | failed | aborted
    failure: tuple[str, str, int] = ("Internal server error", "InternalServerError", 500)
    scheduled_at: float | None = None
    first_token_time: float | None = None
    log: deque[Frame] = field(default_factory=deque)
    log_bytes: int = 0
    next_event_id: int = 1
    encoded_tokens: int = 0
    closed: bool = False
    expires_at: float | None = None
    watchers: set[asyncio.Event] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        n = len(self.plans)
        self.produced = [0] * n
        self.encoded = [0] * n
        self.last_token_time = [None] * n

    def notify(self) -> None:
        for watcher in self.watchers:
            watcher.set()

    def _append(self, frame: bytes, tokens: int, resumable: bool) -> None:
        event_id = self.next_event_id
        self.next_event_id += 1
        self.encoded_tokens += tokens
        if resumable:
            frame = f"id: {event_id}\n".encode() + frame
        self.log.append((event_id, frame, self.encoded_tokens))
        self.log_bytes += len(frame)

    def pull(self, resumable: bool, buffer_size: int) -> None:
        """Encode the tokens produced since the last pull (merging a lagging choice's)."""
        encoder = self.encoder
        if encoder is None or self.closed:
            return
        while self.pending:
            choice = self.pending[0]
            count = 1
            while count < len(self.pending) and self.pending[count] == choice:
                count += 1
            del self.pending[:count]
            plan = self.plans[choice]
            start = self.encoded[choice]
            end = start + count
            self.encoded[choice] = end
            text = "".join(plan.deltas[start:end])
            last = end >= plan.num_tokens
            frames = encoder.output(
                choice,
                text,
                count,
                finish_reason=plan.finish_reason if last else None,
                stop_reason=plan.stop_reason if last else None,
            )
            for i, frame in enumerate(frames):
                self._append(frame, count if i == len(frames) - 1 else 0, resumable)
        if self.state == "finished":
            for frame in encoder.end():
                self._append(frame, 0, resumable)
            self.closed = True
        elif self.state == "failed":
            for frame in encoder.error(*self.failure):
                self._append(frame, 0, resumable)
            self.closed = True
        elif self.state == "aborted":
            self.closed = True
        if resumable:
            while self.log_bytes > buffer_size and len(self.log) > 1:
                self.log_bytes -= len(self.log.popleft()[1])

    def trim(self, upto: int) -> None:
        while self.log and self.log[0][0] <= upto:
            self.log_bytes -= len(self.log.popleft()[1])


# ------------------------------------------------------------------------ engine


class Engine:
    """The emulated vLLM engine: scheduler, jobs, ledger and metrics."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.model = TimingModel(
            prefill_overhead=config.prefill_overhead,
            prefill_per_token=config.prefill_per_token,
            itl=config.itl,
            itl_jitter=config.itl_jitter,
            batch_slowdown=config.batch_slowdown,
            max_num_seqs=config.max_num_seqs,
            kv_block_size=config.kv_block_size,
            kv_num_blocks=config.kv_num_blocks,
            pauses=tuple(Pause(p.after_tokens, p.duration) for p in config.pauses),
        )
        self.fingerprint = wire.fingerprint(config.profile, config.model)
        if config.system_fingerprint != "auto" and self.fingerprint is not None:
            self.fingerprint = config.system_fingerprint  # --fingerprint-mode custom / none
        self.reset()

    def reset(self) -> None:
        """Forget every request and counter (POST /emulator/reset between scenarios)."""
        for job, _ in list(getattr(self, "by_seq", {}).values()):
            self._abort(job, time.time())
        timer: asyncio.TimerHandle | None = getattr(self, "timer", None)
        if timer is not None:
            timer.cancel()
        self.scheduler = Scheduler(self.model)
        self.ids = random.Random(self.config.seed)
        self.ledger: list[LedgerEntry] = []
        self.by_seq: dict[str, tuple[Job, int]] = {}
        self.streams: dict[str, Job] = {}
        self.sequence = 0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_when = 0.0
        self.metrics = Registry(self.config.model, time.time())
        self.gauges = (0, 0, 0.0)
        self._declare_metrics()

    # -- metrics ---------------------------------------------------------------

    def _declare_metrics(self) -> None:
        m = self.metrics
        self._gauges()  # registered first, as vLLM's logger creates them first
        config = self.config
        m.gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            1.0,
            block_size=str(config.kv_block_size),
            num_gpu_blocks=str(config.kv_num_blocks),
        )
        for reason in FINISH_REASONS:
            m.counter("vllm:request_success", "Count of successfully processed requests.", 0.0,
                      finished_reason=reason)  # fmt: skip
        m.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", 0.0)
        m.counter("vllm:generation_tokens", "Number of generation tokens processed.", 0.0)
        m.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 0.0)
        m.counter("vllm:prefix_cache_queries", PREFIX_QUERIES_HELP, 0.0)
        m.counter("vllm:prefix_cache_hits", PREFIX_HITS_HELP, 0.0)
        token_b = token_buckets(self.config.max_model_len)
        for name, help, buckets in self._histograms(token_b):
            m.histogram(name, help, buckets)
        if config.profile == "vllm-0.11":
            help = "Histogram of time per output token in seconds. DEPRECATED."
            m.histogram("vllm:time_per_output_token_seconds", help, ITL_BUCKETS)

    @staticmethod
    def _histograms(token_b: tuple[float, ...]) -> list[tuple[str, str, tuple[float, ...]]]:
        return [
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             TTFT_BUCKETS),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
             ITL_BUCKETS),
            ("vllm:request_time_per_output_token_seconds",
             "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS),
            ("vllm:e2e_request_latency_seconds",
             "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS),
            ("vllm:request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS),
            ("vllm:request_inference_time_seconds",
             "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS),
            ("vllm:request_prefill_time_seconds",
             "Histogram of time spent in PREFILL phase for request.", LATENCY_BUCKETS),
            ("vllm:request_decode_time_seconds",
             "Histogram of time spent in DECODE phase for request.", LATENCY_BUCKETS),
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_b),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.", token_b),
            ("vllm:request_max_num_generation_tokens",
             "Histogram of maximum number of requested generation tokens.", token_b),
            ("vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20)),
            ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
             token_b),
        ]  # fmt: skip

    def _snapshot(self) -> None:
        s = self.scheduler
        self.gauges = (s.num_running, s.num_waiting, s.kv_usage)

    def render_metrics(self) -> str:
        if not self.config.stale_gauges:
            self._snapshot()
        self._gauges()
        return self.metrics.render()

    def _gauges(self) -> None:
        running, waiting, kv = self.gauges
        m = self.metrics
        m.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                running)  # fmt: skip
        m.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                waiting)  # fmt: skip
        if self.config.profile == "vllm-0.33":
            help = "Number of requests waiting to be processed, by reason."
            m.gauge("vllm:num_requests_waiting_by_reason", help, waiting, reason="capacity")
            m.gauge("vllm:num_requests_waiting_by_reason", help, 0, reason="deferred")
        m.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv)

    # -- timer -----------------------------------------------------------------

    def _reschedule(self) -> None:
        deadline = self.scheduler.deadline()
        if self.timer is not None:
            if deadline is not None and self.timer_when == deadline:
                return
            self.timer.cancel()
            self.timer = None
        if deadline is not None:
            self.timer_when = deadline
            self.timer = asyncio.get_running_loop().call_at(deadline, self._tick)

    def _tick(self) -> None:
        self.timer = None
        # call_at may fire a hair early; the deadline it was set for has been reached.
        now = max(asyncio.get_running_loop().time(), self.timer_when)
        events = self.scheduler.advance(now)
        for event in events:
            self._apply(event)
        if events:
            self._snapshot()  # vLLM refreshes scheduler stats after each engine step
        self._reschedule()

    # -- requests --------------------------------------------------------------

    def _new_id(self) -> str:
        bits = wire.id_hex_length(self.config.profile) * 4
        return f"{self.ids.getrandbits(bits):0{bits // 4}x}"

    def start(self, request: ParsedRequest, received_at: float) -> Job:
        """Plan a valid request's text and queue its sequences."""
        config = self.config
        loop_now = asyncio.get_running_loop().time()
        base = request.request_id or self._new_id()
        natural = (config.natural_length_min, config.natural_length_max)
        plans = [
            textgen.plan_choice(
                textgen.request_seed(config.seed, request.body, index),
                request.max_tokens,
                request.limit,
                natural,
                request.stop,
                config.script,
            )
            for index in range(request.n)
        ]
        response_id = wire.response_id(request.endpoint, base)
        entry = LedgerEntry(
            request_id=base,
            endpoint=request.endpoint,
            model=request.model,
            stream=request.stream,
            prompt=request.prompt,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            received_at=received_at,
            id=response_id,
            n=request.n,
            planned_text=plans[0].text,
            planned_texts=[p.text for p in plans],
            planned_tokens=sum(p.num_tokens for p in plans),
            texts=["" for _ in plans],
        )
        if config.resumable and request.stream:
            entry.stream_id = response_id
        encoder = None
        if request.stream:
            encoder = StreamEncoder(
                profile=config.profile,
                endpoint=request.endpoint,
                id=response_id,
                created=config.created if config.created is not None else int(time.time()),
                model=request.model,
                prompt_tokens=request.prompt_tokens,
                n=request.n,
                include_usage=request.include_usage,
                continuous_usage=request.continuous_usage,
                system_fingerprint=self.fingerprint,
            )
        self.sequence += 1
        seq_ids = [f"{self.sequence}-{i}" for i in range(request.n)]
        job = Job(entry, request, plans, seq_ids, loop_now, encoder)
        self.ledger.append(entry)
        if entry.stream_id is not None:
            self._purge_streams(loop_now)
            self.streams[entry.stream_id] = job
        for index, (seq_id, plan) in enumerate(zip(seq_ids, plans, strict=True)):
            self.by_seq[seq_id] = (job, index)
            seed = textgen.request_seed(config.seed, request.body, index)
            self.scheduler.submit(seq_id, loop_now, request.prompt_tokens, plan.num_tokens, seed)
        self._snapshot()  # a new request makes vLLM's engine step, refreshing its stats
        self._reschedule()
        return job

    def _apply(self, event: Admitted | Token) -> None:
        found = self.by_seq.get(event.seq_id)
        if found is None:
            return
        job, choice = found
        if isinstance(event, Admitted):
            if job.scheduled_at is None:
                job.scheduled_at = event.time
            return
        wall = time.time()
        entry = job.entry
        m = self.metrics
        job.produced[choice] += 1
        entry.completion_tokens += 1
        entry.token_times.append(wall)
        entry.texts[choice] += job.plans[choice].deltas[event.index]
        m.counter("vllm:generation_tokens", "Number of generation tokens processed.")
        if job.first_token_time is None:
            job.first_token_time = event.time
            entry.first_token_at = wall
            m.counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                      float(job.request.prompt_tokens))  # fmt: skip
            m.counter("vllm:prefix_cache_queries", PREFIX_QUERIES_HELP,
                      float(job.request.prompt_tokens))  # fmt: skip
            m.histogram("vllm:time_to_first_token_seconds", "", TTFT_BUCKETS,
                        event.time - job.arrival)  # fmt: skip
        previous = job.last_token_time[choice]
        if previous is not None:
            m.histogram("vllm:inter_token_latency_seconds", "", ITL_BUCKETS, event.time - previous)
            if self.config.profile == "vllm-0.11":  # the deprecated alias 0.11 still exposed
                m.histogram("vllm:time_per_output_token_seconds", "", ITL_BUCKETS,
                            event.time - previous)  # fmt: skip
        job.last_token_time[choice] = event.time
        job.pending.append(choice)
        fail_after = self.config.fail_after_tokens
        if fail_after is not None and entry.completion_tokens >= fail_after and not event.last:
            job.failure = wire.failure(job.request.endpoint, self.config.fail_kind)
            self._finish(job, "failed", event.time, wall)
        elif event.last:
            del self.by_seq[event.seq_id]
            if all(p >= plan.num_tokens for p, plan in zip(job.produced, job.plans, strict=True)):
                self._finish(job, "finished", event.time, wall)
        if self.config.resumable and job.request.stream and job.state == "running":
            job.pull(True, self.config.resume_buffer_size)
        job.notify()

    def _finish(self, job: Job, state: str, now: float, wall: float) -> None:
        """A request ended in the engine (all choices done, or failed): count it."""
        for seq_id in job.seq_ids:
            if self.by_seq.pop(seq_id, None) is not None:
                self.scheduler.abort(seq_id, now)
        job.state = state
        entry = job.entry
        entry.finished_at = wall
        if state == "finished":
            entry.finish_reason = job.plans[0].finish_reason
            entry.stop_reason = job.plans[0].stop_reason
        else:
            entry.finish_reason = "error"
        m = self.metrics
        m.counter("vllm:request_success", "", finished_reason=entry.finish_reason)
        token_b = token_buckets(self.config.max_model_len)
        first = job.first_token_time if job.first_token_time is not None else now
        scheduled = job.scheduled_at if job.scheduled_at is not None else job.arrival
        generated = entry.completion_tokens
        observations = [
            ("vllm:e2e_request_latency_seconds", LATENCY_BUCKETS, now - job.arrival),
            ("vllm:request_queue_time_seconds", LATENCY_BUCKETS, scheduled - job.arrival),
            ("vllm:request_inference_time_seconds", LATENCY_BUCKETS, now - scheduled),
            ("vllm:request_prefill_time_seconds", LATENCY_BUCKETS, first - scheduled),
            ("vllm:request_decode_time_seconds", LATENCY_BUCKETS, now - first),
            ("vllm:request_prompt_tokens", token_b, job.request.prompt_tokens),
            ("vllm:request_generation_tokens", token_b, generated),
            ("vllm:request_max_num_generation_tokens", token_b, job.request.limit),
            ("vllm:request_params_n", (1, 2, 5, 10, 20), job.request.n),
            ("vllm:request_params_max_tokens", token_b, job.request.limit),
        ]
        if generated > 1:
            observations.append(("vllm:request_time_per_output_token_seconds", ITL_BUCKETS,
                                 (now - first) / (generated - 1)))  # fmt: skip
        for name, buckets, value in observations:
            m.histogram(name, "", buckets, float(value))
        self._end(job, now)

    def _abort(self, job: Job, wall: float) -> None:
        """A client abort: free the engine; vLLM counts no success and no histograms."""
        if job.state != "running":
            return
        now = asyncio.get_running_loop().time()
        for seq_id in job.seq_ids:
            if self.by_seq.pop(seq_id, None) is not None:
                self.scheduler.abort(seq_id, now)
        job.state = "aborted"
        job.entry.aborted_at = wall
        job.entry.finish_reason = "abort"
        if self.config.log_requests:
            print(f"INFO Aborted request(s) {job.entry.id}.", file=sys.stderr, flush=True)
            print(f"INFO Request {job.entry.id} aborted.", file=sys.stderr, flush=True)
        self._end(job, now)
        self._reschedule()

    def _end(self, job: Job, now: float) -> None:
        job.expires_at = now + self.config.resume_ttl
        if self.config.resumable and job.request.stream:
            job.pull(True, self.config.resume_buffer_size)
        job.done.set()
        job.notify()

    def client_left(self, job: Job) -> None:
        """The client of `job` disconnected (closed, reset or half-closed)."""
        wall = time.time()
        job.entry.disconnected_at = wall
        resumable = self.config.resumable and job.request.stream
        if self.config.abort_on_disconnect and not resumable:
            self._abort(job, wall)

    def _purge_streams(self, now: float) -> None:
        for stream_id, job in list(self.streams.items()):
            if job.expires_at is not None and job.expires_at <= now:
                del self.streams[stream_id]

    def find_stream(self, stream_id: str) -> Job | None:
        self._purge_streams(asyncio.get_running_loop().time())
        return self.streams.get(stream_id)


# ------------------------------------------------------------------------- HTTP


def _date() -> str:
    return email.utils.formatdate(usegmt=True)


def json_response(status: int, body: bytes, extra: dict[str, str] | None = None) -> web.Response:
    """Starlette's JSONResponse as served by uvicorn: date, server, length, type."""
    headers = {"date": _date(), "server": "uvicorn", "content-length": str(len(body)),
               "content-type": wire.JSON_CONTENT_TYPE, **(extra or {})}  # fmt: skip
    return web.Response(status=status, body=body, headers=headers)


class SseResponse(web.StreamResponse):
    """A chunked response whose header names are lower-case, as uvicorn writes them.

    aiohttp names the header it adds `Transfer-Encoding`; uvicorn sends
    `transfer-encoding`. Header names are case-insensitive, but a byte-exact
    upstream lets byte-matching faults and journals compare like with like.
    """

    async def _write_headers(self) -> None:
        encoding = self._headers.popall("Transfer-Encoding", [])
        for value in encoding:
            self._headers.add("transfer-encoding", value)
        await super()._write_headers()


ENGINE_KEY = web.AppKey("engine", Engine)


def _engine(request: web.Request) -> Engine:
    return request.app[ENGINE_KEY]


async def _write(resp: web.StreamResponse, entry: LedgerEntry, data: bytes) -> None:
    await resp.write(data)
    entry.bytes_written += len(data)
    entry.write_times.append(time.time())


class _Evicted(Exception):
    """Frames a live reader had not got yet were evicted from the resume buffer."""


async def _stream_frames(engine: Engine, job: Job, resp: web.StreamResponse, after: int) -> None:
    """Write the job's frames after event `after` as they come, with keep-alives."""
    config = engine.config
    resumable = config.resumable
    entry = job.entry
    loop = asyncio.get_running_loop()
    keep = KeepAlive(config.sse_keep_alive_interval, loop.time())
    wake = asyncio.Event()
    job.watchers.add(wake)
    position = after
    try:
        while True:
            wake.clear()
            if not resumable:
                job.pull(False, 0)
            first = job.log[0][0] if job.log else position + 1
            if position + 1 < first:
                raise _Evicted  # this reader lagged past the resume buffer
            # Event ids are consecutive, so the frames after `position` start at this index.
            for event_id, data, tokens in list(
                itertools.islice(job.log, max(0, position + 1 - first), None)
            ):
                await _write(resp, entry, data)
                position = event_id
                entry.delivered_tokens = max(entry.delivered_tokens, tokens)
                keep.wrote(loop.time())
            if not resumable:
                job.trim(position)
            if job.closed and position >= job.next_event_id - 1:
                break
            deadline = keep.deadline()
            if deadline is None:
                await wake.wait()
                continue
            try:
                await asyncio.wait_for(wake.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                await _write(resp, entry, wire.KEEP_ALIVE)
                keep.wrote(loop.time())
    finally:
        job.watchers.discard(wake)
    if job.state != "aborted":
        await resp.write_eof()


async def _serve_stream(
    engine: Engine, job: Job, request: web.Request, after: int, extra: dict[str, str]
) -> web.StreamResponse:
    headers = {"date": _date(), "server": "uvicorn", "content-type": wire.SSE_CONTENT_TYPE,
               **extra}  # fmt: skip
    resp = SseResponse(status=200, headers=headers)
    try:
        await resp.prepare(request)  # the 200 and headers go out before TTFT, as in vLLM
        await _stream_frames(engine, job, resp, after)
    except asyncio.CancelledError:
        engine.client_left(job)
        raise
    except (ConnectionResetError, ClientConnectionResetError):
        engine.client_left(job)
    except _Evicted:
        # Cut the connection rather than end it cleanly over a gap; the client can
        # resume and will be told the events are gone.
        if request.transport is not None:
            request.transport.abort()
        engine.client_left(job)
    return resp


async def _generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    engine = _engine(request)
    config = engine.config
    received = time.time()
    raw = await request.read()
    if config.cassette:
        return await _serve_cassette(engine, request, endpoint, raw, received)
    header_id = request.headers.get("X-Request-Id")
    extra = {"x-request-id": header_id} if header_id and config.enable_request_id_headers else {}
    try:
        parsed = parse(
            config.profile,
            endpoint,
            request.headers.get("Content-Type", ""),
            raw,
            config.model,
            config.max_model_len,
            config.default_max_tokens,
            header_id,
        )
    except ApiError as error:
        entry = _unparsed_entry(engine, endpoint, raw, received, header_id, error.status)
        entry.finished_at = time.time()
        return json_response(error.status, error.body, extra)
    queue_limit = config.max_num_queued_reqs
    if queue_limit is not None and engine.scheduler.num_waiting >= queue_limit:
        body = wire.error_body(config.profile, wire.QUEUE_FULL_MESSAGE, "Service Unavailable", 503)
        entry = _unparsed_entry(engine, endpoint, raw, received, header_id, 503)
        entry.finished_at = time.time()
        return json_response(503, body, extra)
    job = engine.start(parsed, received)
    job.entry.status = 200
    if config.enable_request_id_headers and not extra:
        extra = {"x-request-id": job.entry.request_id}
    if parsed.stream:
        if job.entry.stream_id is not None:
            extra["x-stream-id"] = job.entry.stream_id
        return await _serve_stream(engine, job, request, 0, extra)
    try:
        await job.done.wait()
    except asyncio.CancelledError:
        engine.client_left(job)
        raise
    if job.state == "failed":
        # Without a stream the exception mapping runs, as for completions (§2.1).
        message, error_type, code = wire.failure("completions", config.fail_kind)
        body = wire.error_body(config.profile, message, error_type, code)
        job.entry.status = code
        job.entry.bytes_written = len(body)
        return json_response(code, body, extra)
    choices = [
        Choice(i, plan.text, plan.finish_reason, plan.stop_reason)
        for i, plan in enumerate(job.plans)
    ]
    usage = Usage(parsed.prompt_tokens, job.entry.completion_tokens)
    build = wire.chat_response if endpoint == "chat" else wire.completion_response
    created = config.created if config.created is not None else int(received)
    body = build(config.profile, job.entry.id or "", created, parsed.model, choices, usage,
                 engine.fingerprint)  # fmt: skip
    job.entry.bytes_written = len(body)
    job.entry.delivered_tokens = job.entry.completion_tokens
    return json_response(200, body, extra)


def _unparsed_entry(
    engine: Engine, endpoint: Endpoint, raw: bytes, received: float, rid: str | None, status: int
) -> LedgerEntry:
    """A ledger entry for a request the engine does not generate for (rejected, cassette)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    max_tokens = body.get("max_tokens")
    entry = LedgerEntry(
        request_id=rid or engine._new_id(),
        endpoint=endpoint,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        stream=body.get("stream") is True,
        prompt=body.get("messages" if endpoint == "chat" else "prompt"),
        prompt_tokens=0,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        received_at=received,
        status=status,
    )
    engine.ledger.append(entry)
    return entry


def _resume_request(request: web.Request) -> str | None:
    """The stream a re-sent POST asks to resume: `X-Stream-Id` plus `Last-Event-ID`.

    Gateways that make streams resumable accept the original request again with these
    headers (the form the resilient client and EventSource-style retries use) as well as
    `GET /v1/streams/{id}`; both land in the same replay.
    """
    if not _engine(request).config.resumable:
        return None
    stream_id = request.headers.get("X-Stream-Id")
    if stream_id and "Last-Event-ID" in request.headers:
        return stream_id
    return None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    stream_id = _resume_request(request)
    if stream_id is not None:
        return await _resume(request, stream_id)
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    stream_id = _resume_request(request)
    if stream_id is not None:
        return await _resume(request, stream_id)
    return await _generate(request, "completions")


async def resume_stream(request: web.Request) -> web.StreamResponse:
    """GET /v1/streams/{stream_id} with `Last-Event-ID`: replay the buffer, then follow."""
    return await _resume(request, request.match_info["stream_id"])


async def _resume(request: web.Request, stream_id: str) -> web.StreamResponse:
    engine = _engine(request)
    profile = engine.config.profile
    job = engine.find_stream(stream_id) if engine.config.resumable else None
    if job is None:
        message = (
            f"Stream `{stream_id}` is unknown or has expired (streams are kept "
            f"{engine.config.resume_ttl:g}s after they end; resumable streams are "
            f"{'on' if engine.config.resumable else 'off'})."
        )
        return json_response(404, wire.error_body(profile, message, "NotFoundError", 404,
                                                  "stream_id"))  # fmt: skip
    raw_last = request.headers.get("Last-Event-ID", "0").strip() or "0"
    try:
        last = int(raw_last)
    except ValueError:
        message = f"Last-Event-ID must be an event id (an integer), got {raw_last!r}."
        return json_response(400, wire.error_body(profile, message, "BadRequestError", 400,
                                                  "Last-Event-ID"))  # fmt: skip
    oldest = job.log[0][0] if job.log else job.next_event_id
    if last + 1 < oldest:
        message = (
            f"Events {last + 1}..{oldest - 1} of stream `{stream_id}` are no longer buffered "
            f"(resume_buffer_size={engine.config.resume_buffer_size} bytes); restart the request."
        )
        return json_response(409, wire.error_body(profile, message, "ConflictError", 409,
                                                  "Last-Event-ID"))  # fmt: skip
    job.entry.resumed_from = last
    job.entry.resumes += 1
    return await _serve_stream(engine, job, request, last, {"x-stream-id": stream_id})


async def _serve_cassette(
    engine: Engine, request: web.Request, endpoint: Endpoint, raw: bytes, received: float
) -> web.StreamResponse:
    """Replay a recorded response: its status, headers and writes at their offsets."""
    assert engine.config.cassette is not None
    cassette = json.loads(Path(engine.config.cassette).read_text(encoding="utf-8"))
    rid = request.headers.get("X-Request-Id")
    status = int(cassette.get("status", 200))
    entry = _unparsed_entry(engine, endpoint, raw, received, rid, status)
    entry.cassette = True
    headers = [(str(k), str(v)) for k, v in cassette.get("headers", [])]
    chunked = any(k.lower() == "transfer-encoding" and "chunked" in v.lower() for k, v in headers)
    kept = [(k, v) for k, v in headers if k.lower() not in ("transfer-encoding", "content-length")]
    writes = [(float(t), base64.b64decode(data)) for t, data in cassette.get("writes", [])]
    resp = web.StreamResponse(status=entry.status or 200, headers=dict(kept))
    if chunked:
        resp.enable_chunked_encoding()
    else:
        resp.content_length = sum(len(data) for _, data in writes)
    start = asyncio.get_running_loop().time()
    try:
        await resp.prepare(request)
        for offset, data in writes:
            delay = start + offset - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
            await _write(resp, entry, data)
        await resp.write_eof()
        entry.finished_at = time.time()
    except (asyncio.CancelledError, ConnectionResetError, ClientConnectionResetError):
        entry.disconnected_at = time.time()
        raise
    return resp


async def models(request: web.Request) -> web.Response:
    config = _engine(request).config
    created = int(time.time())
    card = {
        "id": config.model, "object": "model", "created": created, "owned_by": "vllm",
        "root": config.model, "parent": None, "max_model_len": config.max_model_len,
        "permission": [{
            "id": f"modelperm-{_engine(request)._new_id()}", "object": "model_permission",
            "created": created, "allow_create_engine": False, "allow_sampling": True,
            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
            "allow_fine_tuning": False, "organization": "*", "group": None,
            "is_blocking": False,
        }],
    }  # fmt: skip
    return json_response(200, wire.dumps({"object": "list", "data": [card]}).encode())


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200, headers={"date": _date(), "server": "uvicorn"})


async def version(request: web.Request) -> web.Response:
    profile = _engine(request).config.profile
    return json_response(200, wire.dumps({"version": wire.VLLM_VERSION[profile]}).encode())


async def metrics(request: web.Request) -> web.Response:
    text = _engine(request).render_metrics()
    return web.Response(
        status=200,
        body=text.encode(),
        headers={"date": _date(), "server": "uvicorn",
                 "content-type": "text/plain; version=0.0.4; charset=utf-8"},
    )  # fmt: skip


async def ledger(request: web.Request) -> web.Response:
    entries = [entry.to_json() for entry in _engine(request).ledger]
    return json_response(200, wire.dumps({"requests": entries}).encode())


async def reset(request: web.Request) -> web.Response:
    _engine(request).reset()
    return json_response(200, b'{"reset":true}')


def make_app(config: EmulatorConfig) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = Engine(config)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/streams/{stream_id}", resume_stream)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/emulator/requests", ledger)
    app.router.add_post("/emulator/reset", reset)
    return app


async def serve(
    config: EmulatorConfig,
    host: str,
    port: int,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until cancelled (or `stop` is set); `ready(port)` once listening."""
    # handler_cancellation: a disconnect cancels the handler at once, like Starlette
    # under uvicorn (ASGI spec 2.3) cancels vLLM's generator (reference §3.1).
    runner = web.AppRunner(
        make_app(config),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=config.http_keep_alive_timeout,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    try:
        bound = int(runner.addresses[0][1]) if runner.addresses else port
        if ready is not None:
            ready(bound)
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()


def run_emulator(
    config: EmulatorConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Run the emulator in this thread until interrupted; `ready(port)` once listening."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, host, port, ready))
