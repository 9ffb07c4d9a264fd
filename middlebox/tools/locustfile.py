"""A Locust user that streams chat completions through middlebox and reports TTFT and ITL.

Run it as a locustfile (the module is named locustfile so it never shadows the `locust`
package it imports; `middlebox load --locustfile` prints where it is installed):

    locust -f "$(middlebox load --locustfile)" --host http://127.0.0.1:9000 \
        --headless -u 100 -r 20 -t 1m

or spread the users over machines with Locust's master/worker mode (docs/performance.md):

    locust -f "$(middlebox load --locustfile)" --master --host http://PROXY:9000
    locust -f "$(middlebox load --locustfile)" --worker --master-host MASTER      # on each machine

Besides Locust's own row for the request (time to the response head), every stream
reports `TTFT` (request sent to the first content event) and one `ITL` entry per gap
between content events, as Locust request metrics of type `SSE`, so they appear in the
statistics table, the percentiles, the CSV files and the web UI, aggregated over
workers by the master. A stream that ends without `[DONE]` or with a non-200 status is
a failure with the reason. Options (also as environment variables):
`--chat-path` (MIDDLEBOX_CHAT_PATH), `--chat-model` (MIDDLEBOX_CHAT_MODEL),
`--chat-prompt` (MIDDLEBOX_CHAT_PROMPT), `--chat-max-tokens` (MIDDLEBOX_CHAT_MAX_TOKENS).

Requests use Locust's HttpUser (requests under gevent) and the project's own SSE
framer, so the events are split exactly as middlebox's scorer splits them.
"""

from __future__ import annotations

import time
from typing import Any

from locust import HttpUser, events, task

from middlebox.core.sse import SseFramer
from middlebox.tools.load import DEFAULT_MODEL, DEFAULT_PATH, TokenClock, chat_body


def _options(parser: Any) -> None:
    group = parser.add_argument_group("middlebox chat stream")
    group.add_argument("--chat-path", default=DEFAULT_PATH, env_var="MIDDLEBOX_CHAT_PATH")
    group.add_argument("--chat-model", default=DEFAULT_MODEL, env_var="MIDDLEBOX_CHAT_MODEL")
    group.add_argument("--chat-prompt", default="Tell me a story.", env_var="MIDDLEBOX_CHAT_PROMPT")
    group.add_argument(
        "--chat-max-tokens", type=int, default=64, env_var="MIDDLEBOX_CHAT_MAX_TOKENS"
    )


events.init_command_line_parser.add_listener(_options)  # type: ignore[no-untyped-call]


class ChatStreamUser(HttpUser):
    """Streams one chat completion after another (no think time: a token-stream load)."""

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.path = getattr(options, "chat_path", DEFAULT_PATH)
        self.body = chat_body(
            getattr(options, "chat_model", DEFAULT_MODEL),
            getattr(options, "chat_prompt", "Tell me a story."),
            int(getattr(options, "chat_max_tokens", 64)),
        )

    def _fire(self, name: str, seconds: float, exception: Exception | None = None) -> None:
        self.environment.events.request.fire(
            request_type="SSE",
            name=name,
            response_time=seconds * 1000,
            response_length=0,
            exception=exception,
            context={},
        )

    @task
    def stream_chat(self) -> None:
        sent_at = time.perf_counter()
        clock = TokenClock(sent_at)
        framer = SseFramer()
        with self.client.post(
            self.path,
            json=self.body,
            headers={"Accept": "text/event-stream"},
            stream=True,
            catch_response=True,
            name="chat stream (head)",
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
                return
            try:
                for data in response.iter_content(chunk_size=None):
                    now = time.perf_counter()
                    for line in framer.feed(data):
                        if line.event is not None:
                            clock.event(line.event.data, now)
            except Exception as error:  # requests' ChunkedEncodingError, a reset ...
                response.failure(f"stream broken: {error}")
                self._fire("TTFT", time.perf_counter() - sent_at, error)
                return
            if not clock.done:
                response.failure("stream ended without [DONE]")
            else:
                response.success()
        if clock.ttft is None:
            self._fire("TTFT", time.perf_counter() - sent_at, RuntimeError("no content event"))
            return
        self._fire("TTFT", clock.ttft)
        for gap in clock.itls:
            self._fire("ITL", gap)
