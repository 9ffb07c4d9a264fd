"""The one Prometheus text reader and the one upstream client: what vLLM's /metrics and the
emulator's ledger look like to the runner."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import trio

from middlebox.observe.prometheus import parse_text, totals
from middlebox.run.upstream import (
    GENERATION_TOKENS,
    UpstreamClient,
    UpstreamError,
    metered,
    settled,
    settled_ledger,
)
from tests.run.http_stub import QuietHandler, stub_upstream

# As vLLM 0.x exposes it through prometheus_client: HELP/TYPE lines, labels per model and
# engine, a label value with a space, NaN and +Inf samples.
VLLM_METRICS = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m 7b"} 120.0
vllm:generation_tokens_total{engine="1",model_name="m 7b"} 30.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m 7b"} 0.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m 7b"} 4.0
vllm:kv_cache_usage_perc NaN
process_start_time_seconds 1.7e+09
not a sample line
"""


def test_every_sample_keeps_its_labels_as_written_even_with_a_space_in_a_value() -> None:
    samples = parse_text(VLLM_METRICS)
    assert samples['vllm:generation_tokens_total{engine="0",model_name="m 7b"}'] == 120.0
    assert samples["process_start_time_seconds"] == 1.7e9
    assert samples['vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m 7b"}'] == 4
    assert "not" not in samples and len(samples) == 6


def test_totals_sum_a_metric_over_its_label_sets() -> None:
    summed = totals(VLLM_METRICS)
    assert summed[GENERATION_TOKENS] == 150.0
    assert summed["vllm:num_requests_running"] == 0.0


def test_a_sample_with_a_timestamp_is_read_by_its_value() -> None:
    assert parse_text('up{job="x"} 1 1700000000000\n') == {'up{job="x"}': 1.0}


class FakeVllm(QuietHandler):
    """/v1/models, /emulator/requests (settling after two asks) and /metrics (counting up)."""

    asks = 0
    generated = 100

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "fake/7b"}]}).encode()
        elif self.path == "/emulator/requests":
            FakeVllm.asks += 1
            done = FakeVllm.asks >= 2
            body = json.dumps({"requests": [{"finished_at": 1.0 if done else None}]}).encode()
        elif self.path == "/metrics":
            FakeVllm.generated += 25
            body = f'{GENERATION_TOKENS}{{model_name="fake"}} {FakeVllm.generated}\n'.encode()
        else:
            self.send_error(404)
            return
        self.answer(body)


@pytest.fixture
def fake() -> Iterator[UpstreamClient]:
    FakeVllm.asks, FakeVllm.generated = 0, 100
    with stub_upstream(FakeVllm) as client:
        yield client


def test_the_client_reads_the_first_model_and_the_metrics(fake: UpstreamClient) -> None:
    assert fake.model() == "fake/7b"
    assert fake.metrics() == {GENERATION_TOKENS: 125.0}


def test_an_upstream_without_models_or_metrics_says_so() -> None:
    nobody = UpstreamClient("http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(UpstreamError, match=r"cannot list models at http://127\.0\.0\.1:9/"):
        nobody.model()
    assert nobody.metrics() is None


def test_a_ledger_is_settled_when_every_generation_finished_or_was_aborted() -> None:
    assert settled([{"finished_at": 1.0}, {"aborted_at": 2.0}])
    assert not settled([{"finished_at": 1.0}, {"finished_at": None}])


async def test_the_settled_ledger_is_asked_again_until_it_settles(fake: UpstreamClient) -> None:
    ledger = await settled_ledger(fake, wait=5)
    assert ledger == [{"finished_at": 1.0}] and FakeVllm.asks == 2


async def test_metered_reads_tokens_generated_around_a_run(fake: UpstreamClient) -> None:
    async def run() -> str:
        await trio.lowlevel.checkpoint()
        return "outcome"

    outcome, measured = await metered(fake, run)
    # before 125, ended 150, after 150 is not asked again: nothing is running
    assert outcome == "outcome"
    assert measured == {"server.tokens_generated": 25, "server.tokens_wasted": 0}
