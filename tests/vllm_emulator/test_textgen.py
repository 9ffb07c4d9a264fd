"""The generated text is a pure function of (seed, request), mixes scripts, and ends
the way vLLM ends a request: `length` at max_tokens, EOS `stop`, or a trimmed stop string."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_emulator import textgen

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}


def test_same_seed_and_request_plan_the_same_text_whatever_the_length_or_stream_flags() -> None:
    streamed = {**BODY, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 9}
    assert textgen.request_seed(7, BODY) == textgen.request_seed(7, streamed)
    assert textgen.request_seed(7, BODY) != textgen.request_seed(8, BODY)
    assert textgen.request_seed(7, BODY) != textgen.request_seed(7, {**BODY, "temperature": 0})
    assert textgen.request_seed(7, BODY, index=0) != textgen.request_seed(7, BODY, index=1)
    first = textgen.plan(textgen.request_seed(7, BODY), 50, 0)
    again = textgen.plan(textgen.request_seed(7, BODY), 50, 0)
    assert first == again


def test_max_tokens_gives_exactly_that_many_tokens_and_finish_length() -> None:
    plan = textgen.plan(123, 37, 0)
    assert plan.num_tokens == 37 and len(plan.deltas) == 37
    assert plan.finish_reason == "length" and plan.stop_reason is None
    assert "".join(plan.deltas) == plan.text == b"".join(plan.tokens).decode()


def test_without_max_tokens_the_natural_length_ends_with_an_eos_token_that_decodes_to_nothing() -> (
    None
):
    plan = textgen.plan(123, None, 20)
    assert plan.num_tokens == 21 and plan.tokens[-1] == b"" and plan.deltas[-1] == ""
    assert plan.finish_reason == "stop" and plan.stop_reason is None


def test_text_mixes_ascii_accented_latin_cjk_and_emoji() -> None:
    text = textgen.plan(5, 3000, 0).text
    assert re.search(r"[a-z]", text)
    assert re.search(r"[À-ÿ]", text)
    assert re.search(r"[\u4e00-\u9fff]", text)
    assert re.search(r"[\U0001F300-\U0001FAFF]", text)


def test_an_emoji_split_over_two_tokens_is_sent_whole_with_the_second() -> None:
    plan = textgen.plan(5, 3000, 0)
    split = next(i for i, token in enumerate(plan.tokens) if token[:1] == b"\xf0")
    assert plan.deltas[split] == ""
    assert plan.deltas[split + 1] == (plan.tokens[split] + plan.tokens[split + 1]).decode()


def test_tokens_average_a_few_bytes_like_a_bpe_tokenizer() -> None:
    plan = textgen.plan(9, 2000, 0)
    mean = sum(len(t) for t in plan.tokens) / plan.num_tokens
    assert 2.5 <= mean <= 6.0


def test_a_stop_string_cuts_the_text_before_it_and_is_the_stop_reason() -> None:
    full = textgen.plan(11, 400, 0).text
    stop = full[200:203]
    plan = textgen.plan(11, 400, 0, stop=[stop])
    assert plan.finish_reason == "stop" and plan.stop_reason == stop
    assert plan.text == full[: full.find(stop)]
    assert stop not in plan.text
    assert "".join(plan.deltas) == plan.text


def test_while_stop_strings_are_set_a_possible_prefix_of_one_is_held_back() -> None:
    plan = textgen.plan(11, 30, 0, stop=["zzzzzz"])
    sent = ""
    for token_index, delta in enumerate(plan.deltas[:-1]):
        sent += delta
        decoded = b"".join(plan.tokens[: token_index + 1]).decode("utf-8", errors="ignore")
        assert len(sent) <= max(0, len(decoded) - 5)
    assert sent + plan.deltas[-1] == plan.text


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(1, 120), st.text(min_size=1, max_size=3))
def test_deltas_always_reassemble_the_text_and_match_the_token_count(
    seed: int, max_tokens: int, stop: str
) -> None:
    plan = textgen.plan(seed, max_tokens, 0, stop=[stop])
    assert "".join(plan.deltas) == plan.text
    assert len(plan.deltas) == plan.num_tokens <= max_tokens


def test_prompt_tokens_count_chat_template_overhead_and_token_ids() -> None:
    messages = [{"role": "user", "content": "Hello world"}]
    assert textgen.count_prompt_tokens(messages, chat=True) == 3 + 4 + 2
    assert textgen.count_prompt_tokens([1, 2, 3, 4], chat=False) == 4
    assert textgen.count_prompt_tokens("The city of France is", chat=False) == 5


def test_plan_choice_follows_max_tokens_natural_length_and_the_room_left() -> None:
    assert textgen.plan_choice(1, 30, 100, (5, 9)).num_tokens == 30
    natural = textgen.plan_choice(1, None, 100, (5, 9))
    assert natural.finish_reason == "stop" and 6 <= natural.num_tokens <= 10
    squeezed = textgen.plan_choice(1, None, 4, (5, 9))
    assert squeezed.finish_reason == "length" and squeezed.num_tokens == 4


def test_a_script_is_the_whole_answer_unless_cut_short() -> None:
    script = ["Hello", "!", " How"]
    whole = textgen.plan_choice(1, 10, 100, (5, 9), script=script)
    assert whole.text == "Hello! How" and whole.num_tokens == 4 and whole.finish_reason == "stop"
    cut = textgen.plan_choice(1, 2, 100, (5, 9), script=script)
    assert cut.text == "Hello!" and cut.finish_reason == "length"
