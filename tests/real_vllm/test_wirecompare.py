"""The comparer sees what a faithful emulator must reproduce, and nothing it must not.

Runs without vLLM (in `make test` too): the real 0.32.0 bytes here are from
shared/reference/vllm-0.32-captures (chat-stream-usage.txt, completions-stream.txt), and the
emulator side is built by vllm_emulator.wire, so a changed field in the emulator's output is
shown to fail the comparison.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from pathlib import Path

import pytest

from tests.real_vllm import wirecompare
from tests.real_vllm.cases import CASES, MODEL, NATURAL_PROMPTS, SHORT, asking, asks_short
from tests.real_vllm.conftest import Emulator
from tests.real_vllm.wirecompare import Exchange
from vllm_emulator import apis, wire
from vllm_emulator.metrics import Registry, declare_profile_families

SSE_HEADERS = (
    ("date", "Tue, 01 Dec 2026 08:31:31 GMT"),
    ("server", "uvicorn"),
    ("content-type", "text/event-stream; charset=utf-8"),
    ("vary", "Origin"),
    ("transfer-encoding", "chunked"),
)
CID = "chatcmpl-bb2f30ed62f29c82"
HEAD = f'{{"id":"{CID}","object":"chat.completion.chunk","created":1796113892,"model":"chat",'
REAL_CHAT = (
    f'data: {HEAD}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
    '"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
    f'data: {HEAD}"choices":[{{"index":0,"delta":{{"content":" back"}},"logprobs":null,'
    '"finish_reason":null,"token_ids":null}]}\n\n'
    f'data: {HEAD}"choices":[{{"index":0,"delta":{{"content":" 🧠"}},"logprobs":null,'
    '"finish_reason":null,"token_ids":null}]}\n\n'
    f'data: {HEAD}"choices":[{{"index":0,"delta":{{"content":"The"}},"logprobs":null,'
    '"finish_reason":"length","stop_reason":null,"token_ids":null}]}\n\n'
    f'data: {HEAD}"choices":[],"usage":{{"prompt_tokens":14,"total_tokens":20,'
    '"completion_tokens":6},"system_fingerprint":"vllm-0.32.0-b08c5efa"}\n\n'
    "data: [DONE]\n\n"
).encode()


def real() -> Exchange:
    return Exchange("HTTP/1.1 200 OK", SSE_HEADERS, REAL_CHAT)


def emulated(profile: wire.Profile = "vllm-0.32", tokens: int = 5) -> bytes:
    encoder = wire.StreamEncoder(
        profile, "chat", "chatcmpl-0123456789abcdef", 1700000000, "chat", prompt_tokens=9,
        include_usage=True, system_fingerprint=wire.fingerprint(profile, "chat"),
    )  # fmt: skip
    frames: list[bytes] = []
    for i in range(tokens):
        last = i == tokens - 1
        frames += encoder.output(0, f"w{i}", finish_reason="length" if last else None)
    frames += encoder.end()
    return b"".join(frames)


def exchange(body: bytes, headers: tuple[tuple[str, str], ...] = SSE_HEADERS) -> Exchange:
    return Exchange("HTTP/1.1 200 OK", headers, body)


def test_the_vllm_032_profile_matches_the_real_capture_with_ids_times_text_and_counts_masked() -> (
    None
):
    assert wirecompare.compare(real(), exchange(emulated())) == []


def test_a_run_of_any_length_matches_so_token_counts_and_merged_outputs_do_not_matter() -> None:
    assert wirecompare.compare(real(), exchange(emulated(tokens=1))) == []
    assert wirecompare.compare(real(), exchange(emulated(tokens=2))) == []
    assert wirecompare.compare(real(), exchange(emulated(tokens=40))) == []


def test_the_vllm_033_profile_differs_from_0_32_by_its_two_nulls() -> None:
    finish, token = wirecompare.compare(real(), exchange(emulated("vllm-0.33")))
    assert "('weight_versions', None)" in finish
    assert "('kv_transfer_params', None)" in token


def test_an_added_field_in_the_emulators_chunks_fails_the_comparison() -> None:
    body = emulated().replace(b'"token_ids":null}', b'"token_ids":null,"extra":null}')
    diffs = wirecompare.compare(real(), exchange(body))
    assert diffs and "extra" in diffs[0]


def test_a_changed_value_fails_but_a_changed_text_does_not() -> None:
    assert wirecompare.compare(real(), exchange(emulated().replace(b"w1", b"other"))) == []
    changed = emulated().replace(b'"finish_reason":"length"', b'"finish_reason":"stop"')
    diffs = wirecompare.compare(real(), exchange(changed))
    assert diffs and "'stop'" in diffs[0] and "'length'" in diffs[0]


def test_key_order_and_spacing_are_part_of_the_wire_format() -> None:
    before = b'"logprobs":null,"finish_reason":null,"token_ids":null'
    reordered = emulated().replace(before, b'"finish_reason":null,"logprobs":null,"token_ids":null')
    assert wirecompare.compare(real(), exchange(reordered))
    spaced = emulated().replace(b'{"content":"w1"}', b'{"content": "w1"}')
    diffs = wirecompare.compare(real(), exchange(spaced))
    assert diffs and "'other'" in diffs[0]  # neither compact nor json.dumps: mixed


def test_header_names_and_their_order_are_compared_but_date_is_not() -> None:
    without_vary = tuple(h for h in SSE_HEADERS if h[0] != "vary")
    diffs = wirecompare.compare(real(), exchange(emulated(), without_vary))
    assert diffs and "header names" in diffs[0] and "vary" in diffs[0]
    swapped = (SSE_HEADERS[1], SSE_HEADERS[0], *SSE_HEADERS[2:])
    assert wirecompare.compare(real(), exchange(emulated(), swapped))
    other_date = (("date", "Wed, 02 Dec 2026 00:00:00 GMT"), *SSE_HEADERS[1:])
    assert wirecompare.compare(real(), exchange(emulated(), other_date)) == []


def test_n2_streams_compare_per_choice_whatever_the_interleaving() -> None:
    def two(order: list[int]) -> bytes:
        enc = wire.StreamEncoder("vllm-0.32", "completions", "cmpl-0123456789abcdef", 1, "chat",
                                 prompt_tokens=3, n=2)  # fmt: skip
        frames: list[bytes] = []
        counts = [0, 0]
        for index in order:
            counts[index] += 1
            frames += enc.output(index, "x", finish_reason="length" if counts[index] == 3 else None)
        return b"".join(frames + enc.end())

    a = exchange(two([0, 1, 0, 1, 0, 1]))
    b = exchange(two([0, 0, 1, 1, 1, 0]))
    assert wirecompare.compare(a, b) == []


def test_error_bodies_compare_with_digits_in_messages_masked() -> None:
    headers = (("content-type", "application/json"),)
    msg = "This model's maximum context length is 2048 tokens. However, your prompt contains %d"
    a = Exchange("HTTP/1.1 400 Bad Request", headers, wire.error_body(
        "vllm-0.32", msg % 3001, "BadRequestError", 400, "input_tokens"))  # fmt: skip
    b = Exchange("HTTP/1.1 400 Bad Request", headers, wire.error_body(
        "vllm-0.32", msg % 6002, "BadRequestError", 400, "input_tokens"))  # fmt: skip
    assert wirecompare.compare(a, b) == []
    c = Exchange("HTTP/1.1 400 Bad Request", headers, wire.error_body(
        "vllm-0.32", msg % 6002, "BadRequestError", 400, None))  # fmt: skip
    assert wirecompare.compare(a, c)


METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="chat"} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="chat"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="chat"} 2.0
"""


def test_metrics_compare_names_types_and_label_sets_not_values() -> None:
    assert wirecompare.compare_metrics(METRICS, METRICS.replace("2.0", "7.0")) == []
    as_counter = METRICS.replace("num_requests_running gauge", "num_requests_running counter")
    assert wirecompare.compare_metrics(METRICS, as_counter)
    renamed_label = METRICS.replace('finished_reason="length"', 'finish_reason="length"')
    assert wirecompare.compare_metrics(METRICS, renamed_label)
    missing = METRICS.split("# HELP vllm:request_success_total")[0]
    diffs = wirecompare.compare_metrics(METRICS, missing)
    assert diffs == ["/metrics: missing family vllm:request_success_total (counter)"]


def _cache_config_metrics(cpu_flags: frozenset[str], num_gpu_blocks: int = 8192) -> str:
    registry = Registry("chat", 1.0)
    declare_profile_families(registry, "vllm-0.32", 128, num_gpu_blocks, 8192, cpu_flags)
    return registry.render()


def test_metrics_label_values_differ_by_name_and_masked_ones_do_not() -> None:
    avx2 = _cache_config_metrics(frozenset({"avx2"}))
    avx512 = _cache_config_metrics(frozenset({"avx2", "avx512_bf16"}))
    assert wirecompare.compare_metrics(avx2, avx2) == []
    # an emulator that reported the AVX2 host's dtype on an AVX-512 BF16 host fails, naming it
    assert wirecompare.compare_metrics(avx512, avx2) == [
        "/metrics: vllm:cache_config_info label mamba_ssm_cache_dtype values ['auto'], "
        "expected ['float32']"
    ]
    changed = re.sub(r'\bcache_dtype="auto"', 'cache_dtype="fp8"', avx512)
    assert wirecompare.compare_metrics(avx512, changed) == [
        "/metrics: vllm:cache_config_info label cache_dtype values ['fp8'], expected ['auto']"
    ]
    # num_gpu_blocks names the deployment: masked (kv_cache_size_tokens, pinned, is not)
    other_blocks = avx512.replace('num_gpu_blocks="8192"', 'num_gpu_blocks="4096"')
    assert other_blocks != avx512
    assert wirecompare.compare_metrics(avx512, other_blocks) == []


# ----------------------------------------------------------- Responses and Messages

STREAMS = Path(__file__).resolve().parents[1] / "core" / "streams"


def recorded(name: str) -> Exchange:
    """A real vLLM 0.32.0 stream from tests/core/streams (see its README for the request)."""
    return exchange((STREAMS / name).read_bytes())


def emulated_response(pieces: list[str], limit: int, temperature: float | None = 0) -> bytes:
    # The recording's request: max_output_tokens 3, temperature 0, streamed.
    request = {"model": "chat", "input": "hello", "max_output_tokens": limit, "stream": True}
    if temperature is not None:
        request["temperature"] = temperature
    head = apis.ResponseHead("resp_0123456789abcdef", 1700000000, "chat", request, False, limit)
    encoder = apis.ResponsesEncoder(head, "msg_0123456789abcdef", prompt_tokens=9)
    frames = encoder.start()
    for i, piece in enumerate(pieces):
        frames += encoder.output(0, piece, finish_reason="length" if i == len(pieces) - 1 else None)
    return b"".join(frames + encoder.end())


def emulated_message(pieces: list[str]) -> bytes:
    encoder = apis.MessagesEncoder("chatcmpl-0123456789abcdef", "chat", prompt_tokens=9)
    frames: list[bytes] = []
    for i, piece in enumerate(pieces):
        frames += encoder.output(0, piece, finish_reason="length" if i == len(pieces) - 1 else None)
    return b"".join(frames + encoder.end())


def test_the_emulators_responses_and_messages_streams_match_the_recorded_vllm_ones() -> None:
    # Text, ids, times, counts and the number of text deltas are masked; an empty step
    # (a held-back byte) sends no event in either API.
    real = recorded("vllm-0.32-responses-max-output-tokens.sse")
    assert wirecompare.compare(real, exchange(emulated_response(["a", "", "b", "c"], 3))) == []
    real = recorded("vllm-0.32-messages-max-tokens.sse")
    assert wirecompare.compare(real, exchange(emulated_message(["x", "y", ""]))) == []


@pytest.mark.parametrize(
    ("api", "before", "after"),
    [
        ("responses", b'"service_tier":"auto"', b'"service_tier":"default"'),
        ("responses", b',"phase":null', b""),
        ("responses", b'"status":"incomplete"', b'"status":"completed"'),
        ("responses", b"event: response.completed", b"event: response.incomplete"),
        ("responses", b'"sequence_number":5,', b'"sequence_number":6,'),
        ("messages", b'"stop_reason":"max_tokens"', b'"stop_reason":"end_turn"'),
        ("messages", b',"stop_sequence":null}', b"}"),
        ("messages", b"event: message_stop", b"event: message_end"),
    ],
)
def test_a_changed_field_in_the_emulators_responses_or_messages_fails_the_comparison(
    api: str, before: bytes, after: bytes
) -> None:
    if api == "responses":
        real = recorded("vllm-0.32-responses-max-output-tokens.sse")
        body = emulated_response(["a", "b", "c"], 3)
    else:
        real = recorded("vllm-0.32-messages-max-tokens.sse")
        body = emulated_message(["x", "y", "z"])
    assert wirecompare.compare(real, exchange(body)) == []
    changed = body.replace(before, after, 1)
    assert changed != body
    assert wirecompare.compare(real, exchange(changed)) != []


# ------------------------------------------------------------------ answers without text

# A real 0.32.0 answer to cases.response() whose 4 sampled tokens decoded to no text.
REAL_RESPONSE_NO_TEXT = (STREAMS / "no-text" / "vllm-0.32-responses-no-text.json").read_bytes()
JSON_HEADERS = (("content-type", "application/json"),)


def test_an_answer_whose_sampled_tokens_made_no_text_is_told_apart_from_one_with_text() -> None:
    # Where it must be seen: generated tokens, no text, in each API's form.
    for name in (
        "no-text/vllm-0.32-responses-no-text.sse",
        "no-text/vllm-0.32-messages-no-text.sse",
    ):
        assert wirecompare.sampled_no_text(recorded(name)), name
    no_text = Exchange("HTTP/1.1 200 OK", JSON_HEADERS, REAL_RESPONSE_NO_TEXT)
    assert wirecompare.sampled_no_text(no_text)
    # Where it must not: text (a few deltas, held-back steps among them), a tool call's
    # arguments, an error, and a 200 that generated nothing (a queued background response).
    for name in ("vllm-0.32-responses-max-output-tokens.sse", "vllm-0.32-messages-max-tokens.sse",
                 "vllm-0.32-responses-named-tool-as-text.sse"):  # fmt: skip
        assert not wirecompare.sampled_no_text(recorded(name)), name
    assert not wirecompare.sampled_no_text(real())
    with_text = REAL_RESPONSE_NO_TEXT.replace(
        b'"content":[]', b'"content":[{"annotations":[],"text":"Cli","type":"output_text"}]'
    )
    assert not wirecompare.sampled_no_text(Exchange("HTTP/1.1 200 OK", JSON_HEADERS, with_text))
    call = b'{"output":[{"arguments":"{}","type":"function_call"}],"usage":{"output_tokens":4}}'
    assert not wirecompare.sampled_no_text(Exchange("HTTP/1.1 200 OK", JSON_HEADERS, call))
    error = b'{"error":{"message":"","type":"BadRequestError"},"usage":{"output_tokens":4}}'
    refused = Exchange("HTTP/1.1 400 Bad Request", JSON_HEADERS, error)
    assert not wirecompare.sampled_no_text(refused)
    queued = b'{"output":[],"status":"queued","usage":null}'
    assert not wirecompare.sampled_no_text(Exchange("HTTP/1.1 200 OK", JSON_HEADERS, queued))


def test_the_emulator_writes_an_answer_without_text_as_vllm_does() -> None:
    # Steps that add no text send no event: no message item in a Responses stream, no text
    # block in a Messages one. The emulator's own text is never empty, which is why the tier
    # asks again when vLLM's is (fetch_sampled); the shape itself is modelled and compared here.
    real = recorded("no-text/vllm-0.32-responses-no-text.sse")
    emulated = exchange(emulated_response(["", "", "", ""], 4, temperature=None))
    assert wirecompare.compare(real, emulated) == []
    assert wirecompare.compare(real, exchange(emulated_response(["", "a", "", ""], 4, None)))
    # Not streamed, a message with empty content; streamed and then retrieved, no output.
    for streamed, name in ((False, "vllm-0.32-responses-no-text.json"),
                           (True, "vllm-0.32-responses-no-text-streamed-stored.json")):  # fmt: skip
        real = exchange((STREAMS / "no-text" / name).read_bytes(), JSON_HEADERS)
        request = {"model": "chat", "input": "hello", "max_output_tokens": 4, "stream": streamed}
        head = apis.ResponseHead("resp_0123456789abcdef", 1700000000, "chat", request, False, 4)
        body = apis.response_body(head, "msg_0123456789abcdef", "", "length", 27, 4, streamed)
        assert wirecompare.compare(real, exchange(body, JSON_HEADERS)) == [], name
        other = apis.response_body(head, "msg_0123456789abcdef", "", "length", 27, 4, not streamed)
        assert wirecompare.compare(real, exchange(other, JSON_HEADERS)), name
    real = recorded("no-text/vllm-0.32-messages-no-text.sse")
    assert wirecompare.compare(real, exchange(emulated_message(["", "", "", ""]))) == []
    assert wirecompare.compare(real, exchange(emulated_message(["", "", "x", ""])))


def test_fetch_sampled_asks_again_while_no_text_came_and_stops_at_resamples() -> None:
    answers: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = answers.pop(0) if answers else REAL_RESPONSE_NO_TEXT
            seen.append(body)  # before the answer goes out: the client may check at once
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    seen: list[bytes] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with_text = REAL_RESPONSE_NO_TEXT.replace(b'"content":[]', b'"content":"Cli"')
        answers[:] = [REAL_RESPONSE_NO_TEXT, REAL_RESPONSE_NO_TEXT, with_text]
        got = wirecompare.fetch_sampled(url, "POST", "/v1/responses", {"input": "x"})
        assert got.body == with_text and len(seen) == 3
        seen.clear()
        got = wirecompare.fetch_sampled(url, "POST", "/v1/responses", {"input": "x"})
        assert got.body == REAL_RESPONSE_NO_TEXT and len(seen) == wirecompare.RESAMPLES
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_case_asks_this_hosts_natural_prompt_in_place_of_short_and_others_ask_as_written() -> (
    None
):
    for _, _, _, body in CASES:
        asked = asking(body, "Greet me.")
        assert asks_short(body) == (asked != body)
        assert SHORT not in json.dumps(asked) if isinstance(body, dict) else asked == body
    short = [name for name, _, _, body in CASES if asks_short(body)]
    assert short == ["responses-nonstream-completed", "responses-stream-completed",
                     "messages-nonstream-end-turn", "messages-stream-end-turn"]  # fmt: skip
    assert asking({"input": SHORT, "n": 1}, "Hi.") == {"input": "Hi.", "n": 1}
    assert asking({"messages": [{"role": "user", "content": SHORT}]}, "Hi.") == {
        "messages": [{"role": "user", "content": "Hi."}]
    }


@pytest.mark.parametrize(("shortest", "ends"), [(13, True), (70, False)])
def test_a_prompt_counts_as_ending_by_eos_only_where_the_server_ends_it_within_the_cut(
    middlebox_bin: str, tmp_path: Path, shortest: int, ends: bool
) -> None:
    # the emulator's greedy answers end by EOS after 13-20 tokens, or after 70-80: past 64
    config = {"profile": "vllm-0.32", "model": MODEL, "itl": 0.0005, "prefill_overhead": 0.001,
              "natural_ends": True, "natural_length_min": shortest,
              "natural_length_max": shortest + 10}  # fmt: skip
    emulator = Emulator(middlebox_bin, config, tmp_path)
    try:
        assert wirecompare.ends_by_eos_with_text(emulator.url, MODEL, SHORT) is ends
        found = wirecompare.first_ending_by_eos(emulator.url, MODEL, NATURAL_PROMPTS[:2])
        assert found == (SHORT if ends else None)
    finally:
        emulator.stop()
