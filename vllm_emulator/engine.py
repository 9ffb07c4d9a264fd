"""The emulated vLLM engine: jobs, the scheduler's timer, the ledger and the metrics.

One `Engine` owns the pure `Scheduler` and wakes itself with a loop timer at the
scheduler's next deadline; every due token is applied at once to its request (ledger,
metrics, frames). A `Job` encodes its produced tokens into SSE frames when a writer pulls,
so a writer that falls behind gets several tokens merged into one frame, as vLLM's
RequestOutputCollector merges DELTA outputs when the API consumer lags. A client that
leaves aborts its sequences within the same loop turn and frees their KV blocks (unless
`abort_on_disconnect: false`, when the tokens generated for nobody count as wasted).

Runs on the asyncio loop of the server (loop.call_at, asyncio.Event); knows no HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vllm_emulator import agent, host, textgen, wire
from vllm_emulator.config import EmulatorConfig
from vllm_emulator.ledger import Api, LedgerEntry
from vllm_emulator.metrics import (
    FINISH_REASONS,
    ITL_BUCKETS,
    LATENCY_BUCKETS,
    TTFT_BUCKETS,
    WAITING_BY_REASON_HELP,
    Registry,
    declare_profile_families,
    token_buckets,
    waiting_by_reason,
)
from vllm_emulator.schedule import Admitted, Pause, Scheduler, TimingModel, Token
from vllm_emulator.validation import ParsedRequest
from vllm_emulator.wire import StreamEncoder

PREFIX_QUERIES_HELP = "Prefix cache queries, in terms of number of queried tokens."
PREFIX_HITS_HELP = "Prefix cache hits, in terms of number of cached tokens."

Frame = tuple[int, bytes, int]  # (event id, bytes, tokens delivered once written)


class Encoder(Protocol):
    """Turns engine outputs into one API's frames (wire.StreamEncoder, apis.*Encoder)."""

    def output(
        self,
        index: int,
        text: str,
        num_tokens: int = 1,
        finish_reason: str | None = None,
        stop_reason: wire.StopReason = None,
        channel: str = ...,
        tool: Any = None,
    ) -> list[bytes]: ...

    def end(self) -> list[bytes]: ...

    def error(self, message: str = ..., error_type: str = ..., code: int = ...) -> list[bytes]: ...


@dataclass
class Job:
    """A request in the engine: its plans, progress and the frames it produced."""

    entry: LedgerEntry
    request: ParsedRequest
    plans: list[textgen.Plan]
    seq_ids: list[str]
    arrival: float  # loop time
    encoder: Encoder | None
    # Agent plans (tool calls, JSON, reasoning: agent.py) per choice; None for plain text.
    agents: list[agent.AgentPlan | None] = field(default_factory=list)
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
    hidden_tokens: int = 0  # encoded into no frame (hidden markup): delivered with the next
    closed: bool = False
    # Frames kept for replay after they are written: a resumable stream's (prefixed with
    # `id:`, within resume_buffer_size) or a background response's (all, as vLLM's event
    # store keeps every event of a background stream).
    retain: bool = False
    ids: bool = False
    background: bool = False
    expires_at: float | None = None
    watchers: set[asyncio.Event] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Called once when the request finishes (not failed or aborted): the Responses store.
    done_callbacks: list[Callable[[], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.plans)
        self.produced = [0] * n
        self.encoded = [0] * n
        self.last_token_time = [None] * n
        if not self.agents:
            self.agents = [None] * n

    def channel(self, choice: int, token: int) -> tuple[str, agent.ToolCall | None]:
        """What token `token` of `choice` is on the wire, and the tool call it belongs to."""
        planned = self.agents[choice]
        if planned is None:
            return agent.CONTENT, None
        tool = planned.tools[token]
        return planned.channels[token], planned.tool_calls[tool] if tool >= 0 else None

    def notify(self) -> None:
        for watcher in self.watchers:
            watcher.set()

    def _append(self, frame: bytes, tokens: int, resumable: bool) -> None:
        event_id = self.next_event_id
        self.next_event_id += 1
        self.encoded_tokens += tokens
        if resumable and self.ids:
            frame = f"id: {event_id}\n".encode() + frame
        self.log.append((event_id, frame, self.encoded_tokens))
        self.log_bytes += len(frame)

    def prime(self, frames: list[bytes]) -> None:
        """Frames that go out before the first token (the Responses API's created events)."""
        for frame in frames:
            self._append(frame, 0, self.retain)

    def pull(self, resumable: bool, buffer_size: int | None) -> None:
        """Encode the tokens produced since the last pull (merging a lagging choice's).

        `resumable`: the frames are kept for replay (`retain`); `buffer_size` bounds them
        (None: every frame is kept)."""
        encoder = self.encoder
        if encoder is None or self.closed:
            return
        while self.pending:
            choice = self.pending[0]
            start = self.encoded[choice]
            channel, tool = self.channel(choice, start)
            count = 1
            # A lagging writer merges a choice's tokens, but never across what they are on
            # the wire (reasoning, content, one call's name or arguments).
            while (
                count < len(self.pending)
                and self.pending[count] == choice
                and channel != agent.TOOL_NAME
                and self.channel(choice, start + count) == (channel, tool)
            ):
                count += 1
            del self.pending[:count]
            plan = self.plans[choice]
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
                channel=channel,
                tool=tool,
            )
            if not frames:
                self.hidden_tokens += count
                continue
            count += self.hidden_tokens
            self.hidden_tokens = 0
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
        if resumable and buffer_size is not None:
            while self.log_bytes > buffer_size and len(self.log) > 1:
                self.log_bytes -= len(self.log.popleft()[1])

    def trim(self, upto: int) -> None:
        while self.log and self.log[0][0] <= upto:
            self.log_bytes -= len(self.log.popleft()[1])


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
        # The Responses API's store (api_handlers.py): response id -> what GET answers.
        self.stored: dict[str, Any] = {}
        self.sequence = 0
        # identical requests seen so far (textgen.request_key -> count), for resampling
        self.draws: dict[str, int] = {}
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
        flags = host.this_host_cpu_flags() if config.cpu_flags is None else frozenset(
            config.cpu_flags)  # fmt: skip
        declare_profile_families(m, config.profile, config.kv_block_size, config.kv_num_blocks,
                                 config.max_model_len, flags)  # fmt: skip
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
        if waiting_by_reason(self.config.profile):
            help = WAITING_BY_REASON_HELP
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

    def new_id(self) -> str:
        bits = wire.id_hex_length(self.config.profile) * 4
        return f"{self.ids.getrandbits(bits):0{bits // 4}x}"

    def draw(self, body: dict[str, Any]) -> int:
        """How many identical requests a sampling server has answered before this one: a
        retry continues differently from the first attempt, as with vLLM at
        temperature > 0, unless the request pins `seed` (or `retries_resample` is off,
        or the emulator's own `script` pins the text)."""
        if not self.config.retries_resample or not textgen.samples(body):
            return 0
        key = textgen.request_key(body)
        count = self.draws.get(key, 0)
        self.draws[key] = count + 1
        return count

    def start(
        self,
        request: ParsedRequest,
        received_at: float,
        api: Api | None = None,
        api_id: str | None = None,
        encoder: Encoder | None = None,
        background: bool = False,
    ) -> Job:
        """Plan a valid request's text and queue its sequences.

        `api` names the Responses or Messages API a chat-shaped request came in as, with
        its own response id and encoder (apis.py); a `background` response's frames are all
        kept for `GET /v1/responses/{id}?stream=true` and it outlives its client."""
        config = self.config
        loop_now = asyncio.get_running_loop().time()
        base = request.request_id or self.new_id()
        natural = (config.natural_length_min, config.natural_length_max)
        draw = self.draw(request.body)
        seeds = [textgen.request_seed(config.seed, request.body, i, draw) for i in range(request.n)]
        agents: list[agent.AgentPlan | None] = [None] * request.n
        how = agent.mode(request.body)
        if request.endpoint == "chat" and (how != "text" or config.reasoning_tokens > 0):
            options = agent.Options(config.reasoning_tokens, config.tool_calls_per_response,
                                    wire.id_hex_length(config.profile))  # fmt: skip
            agents = [agent.plan_choice(seed, request.body, request.max_tokens, request.limit,
                                        natural, request.stop,
                                        dataclasses.replace(options,
                                                            id_seed=self.ids.getrandbits(64)))
                      for seed in seeds]  # fmt: skip
            plans = [planned.plan for planned in agents if planned is not None]
        else:
            plans = [
                textgen.plan_choice(seed, request.max_tokens, request.limit, natural,
                                    request.stop, config.script)
                for seed in seeds
            ]  # fmt: skip
        response_id = api_id or wire.response_id(request.endpoint, base)
        entry = LedgerEntry(
            request_id=base,
            endpoint=request.endpoint if api is None else api,
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
        first = agents[0]
        if first is not None:
            kinds = {"json": "json", "text": "text"}
            entry.output_kind = kinds.get(first.mode, "tool_calls")
            entry.tool_choice_mode = first.mode if first.tool_calls else None
            entry.planned_tool_calls = [call.as_json() for call in first.tool_calls]
            entry.planned_reasoning = first.reasoning
            entry.planned_reasoning_tokens = sum(a.reasoning_tokens for a in agents if a)
            entry.output_complete = first.complete
        # The resumable-stream gateway pattern (`id:` lines, /v1/streams/{id}) is chat's and
        # completions'; the Responses API resumes by sequence_number (background), Messages not.
        gateway = config.resumable and api is None
        if gateway and request.stream:
            entry.stream_id = response_id
        entry.background = background
        if request.stream and encoder is None:
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
        job = Job(entry, request, plans, seq_ids, loop_now, encoder if request.stream else None,
                  agents)  # fmt: skip
        job.background = background
        job.retain = request.stream and (background or gateway)
        job.ids = gateway
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
        delta = job.plans[choice].deltas[event.index]
        channel, tool = job.channel(choice, event.index)
        if channel == agent.CONTENT:
            entry.texts[choice] += delta
        elif channel == agent.REASONING:
            entry.reasoning_tokens += 1
            if choice == 0:
                entry.reasoning += delta
        elif tool is not None and choice == 0:
            if tool.index >= len(entry.tool_calls):
                entry.tool_calls.append({"index": tool.index, "id": tool.id, "name": tool.name,
                                         "arguments": ""})  # fmt: skip
            entry.tool_calls[tool.index]["arguments"] += delta
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
        if job.retain and job.state == "running":
            job.pull(True, self._buffer(job))
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
            planned = job.agents[0]
            entry.engine_finish_reason = (
                planned.engine_finish_reason if planned is not None else entry.finish_reason
            )
        else:
            entry.finish_reason = entry.engine_finish_reason = "error"
        m = self.metrics
        # The engine's reason: `tool_calls` is the API server's word, never the engine's.
        m.counter("vllm:request_success", "", finished_reason=entry.engine_finish_reason)
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
        job.entry.finish_reason = job.entry.engine_finish_reason = "abort"
        if self.config.log_requests:
            print(f"INFO Aborted request(s) {job.entry.id}.", file=sys.stderr, flush=True)
            print(f"INFO Request {job.entry.id} aborted.", file=sys.stderr, flush=True)
        self._end(job, now)
        self._reschedule()

    def _end(self, job: Job, now: float) -> None:
        job.expires_at = now + self.config.resume_ttl
        if job.retain:
            job.pull(True, self._buffer(job))
        if job.state == "finished":
            for callback in job.done_callbacks:
                callback()
        job.done.set()
        job.notify()

    def _buffer(self, job: Job) -> int | None:
        return None if job.background else self.config.resume_buffer_size

    def client_left(self, job: Job) -> None:
        """The client of `job` disconnected (closed, reset or half-closed).

        A background response goes on (vLLM runs it as a task of its own); a resumable
        stream waits for its client to come back."""
        wall = time.time()
        job.entry.disconnected_at = wall
        if self.config.abort_on_disconnect and not job.retain:
            self._abort(job, wall)

    def cancel(self, job: Job) -> None:
        """`POST /v1/responses/{id}/cancel`: vLLM cancels the background task, which aborts
        the request in the engine (no success counted, as for a client abort)."""
        wall = time.time()
        job.entry.cancelled_at = wall
        self._abort(job, wall)

    def _purge_streams(self, now: float) -> None:
        for stream_id, job in list(self.streams.items()):
            if job.expires_at is not None and job.expires_at <= now:
                del self.streams[stream_id]

    def find_stream(self, stream_id: str) -> Job | None:
        self._purge_streams(asyncio.get_running_loop().time())
        return self.streams.get(stream_id)
