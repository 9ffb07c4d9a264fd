"""A workload planned within the server's context (`max_model_len`).

Against a real server a stream is sized in time (`suite.paced`), so a fast server is asked for
more tokens than the scenario's own `max_tokens`. vLLM rejects `max_tokens` above its
`max_model_len` (400: "max_tokens=2547 cannot be greater than max_model_len=2048") and clamps
one that fits to the room the prompt leaves (vllm/renderers/params.py), which would end the
stream early with `finish_reason: "length"`. So the paced stream is kept within the context
the server lists (`GET /v1/models`' `max_model_len`, which vLLM and the emulator both report):
when the planned length does not fit, the stream is cut to the room left so long as that still
covers the scenario's own length at the server's pace; otherwise the scenario is not run and
says in one line what the server needs to be started with.
"""

from __future__ import annotations

import dataclasses
import json

from middlebox.scenario.workload import Workload, request_body, request_tag

PROMPT_TEMPLATE_ALLOWANCE = 256
"""Tokens a chat template may add around the request's own text (role markers, a tool-calling
system prompt): the prompt's bound is its bytes, since a byte-level tokenizer's token covers
at least one byte, plus this."""
LONGEST_CLIENT_NAME = 40


def prompt_token_bound(workload: Workload, scenario: str, model: str) -> int:
    """At most how many tokens the prompt of any of the scenario's requests takes."""
    tag = request_tag(scenario, "c" * LONGEST_CLIENT_NAME, workload.requests)
    body = request_body(workload, model, tag)
    prompt = {k: body[k] for k in ("messages", "prompt", "tools", "response_format") if k in body}
    return len(json.dumps(prompt, ensure_ascii=False).encode()) + PROMPT_TEMPLATE_ALLOWANCE


def suggested_context(tokens: int) -> int:
    """The power of two at or above `tokens`: the value a `--max-model-len` usually takes."""
    return 1 << max(tokens - 1, 1).bit_length()


def within_context(
    planned: Workload, least: Workload, context: int | None, prompt_tokens: int
) -> tuple[Workload, str | None]:
    """`planned` if its stream fits the context, else cut to the room left when that is still
    `least` (the scenario's own length at the server's pace, no margins) or more; else the
    one line saying which context it needs. `context` None: the server lists none."""
    if context is None:
        return planned, None
    room = context - prompt_tokens
    if planned.max_tokens <= room:
        return planned, None
    if least.max_tokens <= room:
        return dataclasses.replace(planned, max_tokens=room), None
    needed = least.max_tokens + prompt_tokens
    return planned, (
        f"needs a context of {needed} tokens, the server has {context}: "
        f"start vLLM with --max-model-len {suggested_context(needed)}"
    )
