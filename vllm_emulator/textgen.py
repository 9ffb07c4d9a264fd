"""Deterministic text generation (pure): tokens as a function of (seed, request).

The scorer must know the exact text every request produces, so generation is a
pure function of the emulator seed and the request body's canonical JSON, minus
the fields that do not change what a seeded sampler draws (`stream`,
`stream_options`, `max_tokens`, `max_completion_tokens`, `stop`, `n`,
`request_id`, `user`): a streamed and a non-streamed request plan the same text,
and a shorter `max_tokens` or a stop string gives a prefix of it, as with a fixed
sampling seed in vLLM. Choice `i` of an `n > 1` request gets its own stream.

The text mixes ASCII with accented Latin, CJK and emoji so that any byte-level
cut shows up as mojibake. Tokens are byte strings sized like a byte-level BPE
tokenizer's: short English words with their leading space are one token, longer
ones split in two or three, CJK is about one character per token, and an emoji's
four UTF-8 bytes span two tokens. A token that ends inside a UTF-8 sequence
decodes to nothing until the next one completes it, as vLLM's incremental
detokenizer (tokenizers' DecodeStream) holds back incomplete characters.

Stops follow vLLM v1 (`vllm/v1/engine/detokenizer.py`): a stop string is searched
only in the newly decoded text plus its overlap, the output is cut before it
(`include_stop_str_in_output` false) and `stop_reason` is the string; while
streaming with stop strings, the last `max(len(stop)) - 1` characters are held
back until the request finishes, so a partial stop string is never sent.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

UNSAMPLED_FIELDS = frozenset(
    {"stream", "stream_options", "max_tokens", "max_completion_tokens", "stop", "n",
     "request_id", "user"}
)  # fmt: skip

_ASCII_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "not",
    "but",
    "which",
    "one",
    "all",
    "were",
    "when",
    "there",
    "can",
    "more",
    "if",
    "will",
    "about",
    "so",
    "what",
    "out",
    "up",
    "into",
    "time",
    "model",
    "token",
    "stream",
    "server",
    "client",
    "network",
    "proxy",
    "buffer",
    "packet",
    "latency",
    "gateway",
    "request",
    "response",
    "timeout",
    "connection",
    "generation",
    "inference",
    "cluster",
    "kernel",
    "socket",
    "chunk",
    "event",
    "window",
    "handshake",
    "throughput",
    "bandwidth",
    "retry",
    "backoff",
    "deadline",
    "scheduler",
    "batch",
    "cache",
    "quickly",
    "carefully",
    "although",
    "however",
    "therefore",
    "meanwhile",
    "interesting",
    "international",
]
_ACCENTED_WORDS = [
    "café",
    "naïve",
    "façade",
    "über",
    "señor",
    "déjà",
    "vu",
    "crème",
    "brûlée",
    "Ærøskøbing",
    "São",
    "Paulo",
    "jalapeño",
    "Zürich",
    "Kraków",
    "smørrebrød",
    "garçon",
    "élan",
    "résumé",
    "fiancée",
    "Ångström",
    "coöperate",
]
_CJK_WORDS = ("東京", "日本語", "你好", "世界", "数据", "网络", "한국어", "서울", "流式", "模型")
_EMOJI = ("🙂", "🚀", "👍", "🎉", "🔥", "🌍", "✨", "🤖")
_PUNCT = (",", ",", ";", ":")


def request_key(body: Mapping[str, Any]) -> str:
    """The canonical JSON of a request body, without fields that do not steer sampling."""
    kept = {k: v for k, v in body.items() if k not in UNSAMPLED_FIELDS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_seed(seed: int, body: Mapping[str, Any], index: int = 0, draw: int = 0) -> int:
    """A 64-bit seed for choice `index` of this request, stable across processes; `draw`
    counts earlier identical requests that a sampling server answered (0: the first)."""
    again = f"\x00draw{draw}" if draw else ""
    digest = hashlib.sha256(f"{seed}\x00{index}\x00{request_key(body)}{again}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def samples(body: Mapping[str, Any]) -> bool:
    """Whether vLLM would draw this request's tokens afresh each time it is sent: sampling
    (temperature > 0; absent, vLLM's default is 1.0) without a per-request `seed`, which
    makes vLLM's sampler reproducible (SamplingParams.seed)."""
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    return isinstance(temperature, int | float) and temperature > 0 and body.get("seed") is None


def _word_tokens(word: str, lead: str) -> list[bytes]:
    """Split `lead + word` the way a byte-level BPE would, roughly."""
    if word.isascii():
        text = lead + word
        if len(word) <= 6:
            return [text.encode()]
        pieces = [text[: len(text) // 2], text[len(text) // 2 :]]
        if len(word) > 11:
            third = len(text) // 3
            pieces = [text[:third], text[third : 2 * third], text[2 * third :]]
        return [piece.encode() for piece in pieces]
    if all(ord(ch) >= 0x1100 for ch in word):  # CJK/Hangul: about one character a token
        out = [ch.encode() for ch in word]
        if lead:
            out.insert(0, lead.encode())
        return out
    # Accented Latin: the ASCII run is one token, each accented letter its own.
    tokens: list[bytes] = []
    current = lead
    for ch in word:
        if ch.isascii():
            current += ch
        else:
            if current:
                tokens.append(current.encode())
            tokens.append(ch.encode())
            current = ""
    if current:
        tokens.append(current.encode())
    return tokens


def token_stream(seed: int) -> Iterator[bytes]:
    """An endless, seeded stream of tokens (byte strings) forming sentences."""
    rng = random.Random(seed)
    first = True
    while True:
        length = rng.randint(5, 14)
        for position in range(length):
            lead = "" if first else " "
            first = False
            roll = rng.random()
            if roll < 0.74:
                word = rng.choice(_ASCII_WORDS)
                if position == 0:
                    word = word.capitalize()
                yield from _word_tokens(word, lead)
            elif roll < 0.86:
                yield from _word_tokens(rng.choice(_ACCENTED_WORDS), lead)
            elif roll < 0.95:
                yield from _word_tokens(rng.choice(_CJK_WORDS), lead)
            else:
                emoji = rng.choice(_EMOJI).encode()
                if lead:
                    yield lead.encode()
                yield emoji[:2]  # byte-level BPE splits a 4-byte emoji mid-sequence
                yield emoji[2:]
            if position < length - 1 and rng.random() < 0.08:
                yield rng.choice(_PUNCT).encode()
        yield b"." if rng.random() < 0.8 else b"!"
        if rng.random() < 0.15:
            yield b"\n\n"
            first = True


def count_text_tokens(text: str) -> int:
    """Approximate token count of a prompt text, consistent with the generator."""
    return len(re.findall(r" ?[A-Za-z]{1,6}| ?\d{1,3}|[^\x00-\x7f]|\s+|[^\sA-Za-z\d]", text))


def count_prompt_tokens(prompt: Any, chat: bool) -> int:
    """Prompt tokens of a chat `messages` list or a completions `prompt`.

    Chat adds a template overhead per message (role markers) and for the
    generation prompt, as chat templates do. A completions prompt may be a string,
    a list of strings (only the first is used here) or token ids.
    """
    if chat:
        total = 3  # the assistant generation prompt
        for message in prompt:
            total += 4
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, str):
                total += count_text_tokens(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                        total += count_text_tokens(part["text"])
        return total
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        prompt = prompt[0] if prompt else ""
        if isinstance(prompt, list):
            return len(prompt)
    return max(1, count_text_tokens(str(prompt)))


@dataclass(frozen=True)
class Plan:
    """What one choice will produce: per-token stream deltas and the final outcome.

    `deltas[k]` is the text sent with token k (possibly "" while a character or a
    possible stop string is held back); the last one carries the finish reason.
    `text` is the full output (the concatenation of deltas).
    """

    tokens: tuple[bytes, ...]
    deltas: tuple[str, ...]
    text: str
    finish_reason: str
    stop_reason: str | None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


def plan(
    seed: int,
    max_tokens: int | None,
    natural_length: int,
    stop: Sequence[str] = (),
    script: Sequence[str] | None = None,
) -> Plan:
    """Plan a choice: `max_tokens` tokens ending in `length` when given, else
    `natural_length` tokens then an EOS token ending in `stop`; a stop string ends
    it earlier with `stop` and the string as `stop_reason`. With a `script`, its
    strings are the tokens instead of the seeded stream (it must be long enough).
    """
    if max_tokens is not None:
        limit, eos = max_tokens, False
    else:
        limit, eos = natural_length, True
    stop = [s for s in stop if s]
    buffer = max((len(s) for s in stop), default=1) - 1
    decoder = codecs.getincrementaldecoder("utf-8")()
    tokens: list[bytes] = []
    deltas: list[str] = []
    output = ""
    sent = 0
    stop_reason: str | None = None
    finish_reason = "length" if not eos else "stop"
    stream = token_stream(seed) if script is None else iter([t.encode() for t in script])
    while len(tokens) < limit:
        token = next(stream)
        tokens.append(token)
        new_text = decoder.decode(token)
        output += new_text
        for candidate in stop:
            start = max(0, len(output) - len(new_text) - len(candidate) + 1)
            found = output.find(candidate, start)
            if found != -1:
                output = output[:found]
                stop_reason, finish_reason = candidate, "stop"
                break
        if stop_reason is not None:
            break
        finished = len(tokens) == limit and not eos
        visible = len(output) if finished else len(output) - buffer
        deltas.append(output[sent:visible] if visible > sent else "")
        sent = max(sent, visible)
    if stop_reason is not None or eos:
        if eos and stop_reason is None:
            tokens.append(b"")  # the EOS token: counted, decodes to ""
        deltas.append(output[sent:])
    return Plan(tuple(tokens), tuple(deltas), output, finish_reason, stop_reason)


def natural_length(seed: int, low: int, high: int) -> int:
    """The seeded length (before EOS) of a request that gave no `max_tokens`."""
    return random.Random(seed ^ 0x5EED).randint(low, high)


def plan_choice(
    seed: int,
    max_tokens: int | None,
    limit: int,
    natural: tuple[int, int],
    stop: Sequence[str] = (),
    script: Sequence[str] | None = None,
) -> Plan:
    """Plan one choice of a request the way the emulator answers it.

    Generated text: `max_tokens` given → exactly that many, `length`; otherwise a
    seeded natural length in `natural` then EOS, unless the EOS would not fit in
    `limit` (the room left), which cuts it at the limit with `length`. A script is
    the whole answer: it ends in EOS after its last token unless `max_tokens` or
    the limit cuts it first.
    """
    if script is not None:
        cut = min(limit if max_tokens is None else max_tokens, limit)
        if len(script) + 1 > cut:
            return plan(seed, cut, 0, stop, script)
        return plan(seed, None, len(script), stop, script)
    if max_tokens is not None:
        return plan(seed, max_tokens, 0, stop)
    length = natural_length(seed, *natural)
    if length + 1 > limit:
        return plan(seed, limit, 0, stop)
    return plan(seed, None, length, stop)
