"""The emulated engine's timing model (pure): when each sequence gets each token.

A discrete-event model of vLLM's scheduler, driven by `now` from outside so it
runs the same on a virtual clock (tests) and on the wall clock (the app):

- Admission is first come, first served, like vLLM's FCFS scheduler: the head of
  the waiting queue is admitted when fewer than `max_num_seqs` sequences run and
  its KV blocks fit; if it does not fit, nobody behind it jumps the queue.
- KV blocks: a sequence reserves ceil((prompt + output tokens) / block_size)
  blocks at admission (no preemption is modelled) and frees them when it finishes
  or is aborted, which may admit waiters at that instant.
- Prefill: the first token comes `prefill_overhead + prefill_per_token * prompt`
  after admission, scaled by the batch load factor.
- Decode: each next token comes `itl * load * jitter` after the previous one,
  where load = 1 + batch_slowdown * (running - 1) at that moment and jitter is a
  seeded Gaussian around 1 (relative std-dev `itl_jitter`, clamped to ±70% like
  llm-d's inference-sim). Optional pauses add a gap after a given token count
  (a tool call, a long prefill of another request) to exercise idle timeouts.

`advance(now)` returns every event due by `now` in time order; `deadline()` says
when the next one is due. Event times are the model's, not when the caller got
round to them, so lateness never accumulates.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pause:
    """After `after_tokens` tokens of a sequence, the next one waits `duration` longer."""

    after_tokens: int
    duration: float


@dataclass(frozen=True)
class TimingModel:
    """The engine's parameters (seconds, tokens, blocks)."""

    prefill_overhead: float = 0.1
    prefill_per_token: float = 0.0002
    itl: float = 0.03
    itl_jitter: float = 0.1
    batch_slowdown: float = 0.002
    max_num_seqs: int = 256
    kv_block_size: int = 16
    kv_num_blocks: int = 4096
    pauses: tuple[Pause, ...] = ()

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.kv_block_size)


@dataclass(frozen=True)
class Admitted:
    """A sequence left the waiting queue and started prefill at `time`."""

    seq_id: str
    time: float


@dataclass(frozen=True)
class Token:
    """Token `index` (0-based) of a sequence was produced at `time`; `last` ends it."""

    seq_id: str
    index: int
    time: float
    last: bool


Event = Admitted | Token


@dataclass
class _Seq:
    seq_id: str
    prompt_tokens: int
    output_tokens: int
    blocks: int
    rng: random.Random
    produced: int = 0
    generation: int = 0  # bumped on abort so stale heap entries are skipped


@dataclass
class Scheduler:
    """FCFS admission, KV budget and per-token timing for all sequences."""

    model: TimingModel
    _waiting: list[_Seq] = field(default_factory=list, init=False)
    _running: dict[str, _Seq] = field(default_factory=dict, init=False)
    _heap: list[tuple[float, int, str, int]] = field(default_factory=list, init=False)
    _counter: int = field(default=0, init=False)
    _used_blocks: int = field(default=0, init=False)
    _pending: list[Event] = field(default_factory=list, init=False)

    # ------------------------------------------------------------------ queries

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use, as `vllm:kv_cache_usage_perc` (0..1)."""
        return self._used_blocks / self.model.kv_num_blocks

    def load_factor(self) -> float:
        return 1.0 + self.model.batch_slowdown * max(0, self.num_running - 1)

    def deadline(self) -> float | None:
        if self._pending:
            return self._pending[0].time
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    # ------------------------------------------------------------------ inputs

    def submit(
        self, seq_id: str, now: float, prompt_tokens: int, output_tokens: int, seed: int
    ) -> None:
        """Queue a sequence that will produce `output_tokens` tokens (at least 1)."""
        if output_tokens < 1:
            raise ValueError(f"a sequence produces at least one token, got {output_tokens}")
        if seq_id in self._running or any(s.seq_id == seq_id for s in self._waiting):
            raise ValueError(f"sequence {seq_id!r} is already scheduled")
        blocks = self.model.blocks_for(prompt_tokens + output_tokens)
        if blocks > self.model.kv_num_blocks:
            raise ValueError(
                f"sequence {seq_id!r} needs {blocks} KV blocks but the cache has "
                f"{self.model.kv_num_blocks}"
            )
        self._waiting.append(
            _Seq(seq_id, prompt_tokens, output_tokens, blocks, random.Random(seed))
        )
        self._admit(now)

    def abort(self, seq_id: str, now: float) -> bool:
        """Drop a waiting or running sequence, freeing its slot and KV blocks.

        Returns whether it was still scheduled. Waiters may be admitted at `now`.
        """
        for position, seq in enumerate(self._waiting):
            if seq.seq_id == seq_id:
                del self._waiting[position]
                self._admit(now)
                return True
        if seq_id not in self._running:
            return False
        seq = self._running.pop(seq_id)
        seq.generation += 1
        self._used_blocks -= seq.blocks
        self._admit(now)
        return True

    def advance(self, now: float) -> list[Event]:
        """Every event due by `now`, in time order (ties in scheduling order)."""
        out: list[Event] = []
        while True:
            self._drop_stale()
            pending_time = self._pending[0].time if self._pending else math.inf
            heap_time = self._heap[0][0] if self._heap else math.inf
            if min(pending_time, heap_time) > now:
                return out
            if pending_time <= heap_time:
                out.append(self._pending.pop(0))
                continue
            time, _, seq_id, _ = heapq.heappop(self._heap)
            out.append(self._produce(self._running[seq_id], time))

    # ------------------------------------------------------------------ internals

    def _drop_stale(self) -> None:
        while self._heap:
            _, _, seq_id, generation = self._heap[0]
            seq = self._running.get(seq_id)
            if seq is not None and seq.generation == generation:
                return
            heapq.heappop(self._heap)

    def _push(self, time: float, seq: _Seq) -> None:
        self._counter += 1
        heapq.heappush(self._heap, (time, self._counter, seq.seq_id, seq.generation))

    def _admit(self, now: float) -> None:
        model = self.model
        while self._waiting and len(self._running) < model.max_num_seqs:
            head = self._waiting[0]
            if self._used_blocks + head.blocks > model.kv_num_blocks:
                return  # FCFS: the head waits for blocks and nobody overtakes it
            self._waiting.pop(0)
            self._running[head.seq_id] = head
            self._used_blocks += head.blocks
            self._pending.append(Admitted(head.seq_id, now))
            prefill = model.prefill_overhead + model.prefill_per_token * head.prompt_tokens
            self._push(now + prefill * self.load_factor(), head)

    def _jitter(self, seq: _Seq) -> float:
        if self.model.itl_jitter <= 0:
            return 1.0
        return min(1.7, max(0.3, seq.rng.gauss(1.0, self.model.itl_jitter)))

    def _produce(self, seq: _Seq, time: float) -> Token:
        index = seq.produced
        seq.produced += 1
        last = seq.produced >= seq.output_tokens
        if last:
            del self._running[seq.seq_id]
            self._used_blocks -= seq.blocks
            self._admit(time)
        else:
            gap = self.model.itl * self.load_factor() * self._jitter(seq)
            gap += sum(p.duration for p in self.model.pauses if p.after_tokens == seq.produced)
            self._push(time + gap, seq)
        return Token(seq.seq_id, index, time, last)


@dataclass
class KeepAlive:
    """vLLM's `--sse-keep-alive-interval`: a comment once a stream was idle `interval`.

    vLLM's `_keep_alive_stream` waits for the next frame with a timeout of the
    interval and sends `: keep-alive` each time it expires; any frame resets it.
    An interval of 0 (the default) disables it.
    """

    interval: float
    last_write: float = 0.0

    def wrote(self, now: float) -> None:
        self.last_write = now

    def deadline(self) -> float | None:
        return self.last_write + self.interval if self.interval > 0 else None

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline
