"""The proxy presets: each loads, expands to real faults, and on a virtual clock shows the
behaviour `make calibrate` measured on the real proxy (docs/calibration.md).

The stream is what vLLM sends: a chunked 200 head 20 ms before the first token, then a
~330-byte `data:` frame every 20 ms (one HTTP chunk each), `[DONE]` and the last chunk.
"""

from __future__ import annotations

import gzip

import pytest

from faults import REGISTRY
from faults.presets import PRESETS
from faults.testing import TimedItem, replay
from middlebox.fault import Pipeline
from middlebox.scenario import FaultSpec, load_scenario_text
from middlebox.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.httpprops import dechunked
from tests.faults.httpstreams import down_bytes, ends, sse_response, timeline

ITL = 0.02
TOKENS = [f"tok{i:02d} " + "x" * 250 for i in range(60)]


def pipeline(name: str) -> Pipeline:
    scenario = load_scenario_text(
        f"name: t\npath:\n  - preset: {name}\n", REGISTRY, presets=PRESETS
    )
    return Pipeline(spec.build() for spec in scenario.path)


def stream(tokens: list[str] = TOKENS) -> list[TimedItem]:
    return timeline(sse_response(*tokens), step=ITL)


def down_times(output: list[TimedItem]) -> list[float]:
    return [t for t, i in output if isinstance(i, Chunk) and i.direction is DOWN]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loads_and_expands_into_registered_faults(name: str) -> None:
    scenario = load_scenario_text(
        f"name: t\npath:\n  - latency: {{delay: 1ms}}\n  - preset: {name}\n", REGISTRY,
        presets=PRESETS,
    )  # fmt: skip
    assert scenario.path[0].name == "latency"
    assert all(spec.cls is REGISTRY[spec.name] for spec in scenario.path)
    replay(pipeline(name), stream())  # and each runs a whole stream without error


def test_the_presets_expand_to_the_faults_docs_calibration_names() -> None:
    expanded = {name: [spec.name for spec in pipeline_specs(name)] for name in PRESETS}
    assert expanded == {
        "passthrough": [],
        "nginx-default": ["strip_header", "proxy_buffering", "idle_reaper"],
        "nginx-streaming": ["strip_header", "idle_reaper"],
        "nginx-gzip": ["strip_header", "gzip_encoding", "proxy_buffering", "idle_reaper"],
        "haproxy-default": ["coalescer", "ignore_client_close", "idle_reaper"],
        "apache-default": ["ignore_client_close", "idle_reaper"],
        "caddy-default": [],
    }


def pipeline_specs(name: str) -> tuple[FaultSpec, ...]:
    text = f"name: t\npath:\n  - preset: {name}\n"
    return tuple(load_scenario_text(text, REGISTRY, presets=PRESETS).path)


def test_nginx_default_sends_the_head_with_the_first_4_kib_burst_and_the_rest_at_the_end() -> None:
    sent = stream()
    out = replay(pipeline("nginx-default"), sent)
    writes = [i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN]
    assert all(len(w) >= 4096 for w in writes[:-1])
    assert len(writes) == 5  # as the real nginx 1.22 did: 4160, 4104, 4104, 4104, 1899 bytes
    assert writes[0].startswith(b"HTTP/1.1 200 OK")
    filled = next(t for t, _ in sent if len(down_bytes([x for x in sent if x[0] <= t])) >= 4096)
    assert down_times(out)[0] == filled  # the read that fills the first 4 KiB buffer
    assert down_bytes(out) == down_bytes(sent)


def test_nginx_default_closes_a_silent_stream_after_proxy_read_timeout_without_the_last_chunk() -> (
    None
):
    writes = sse_response(*TOKENS[:10], done=False)
    sent = timeline(writes, step=ITL)
    out = replay(pipeline("nginx-default"), sent, until=100.0)
    last = sent[-1][0]
    assert [i for _, i in ends(out)] == [Eof(DOWN), Eof(UP)]
    assert [t for t, _ in ends(out)] == pytest.approx([last + 60.0, last + 60.0])
    ((body, complete),) = dechunked(down_bytes(out))
    assert not complete and b"[DONE]" not in body


def test_nginx_streaming_passes_every_write_when_it_comes() -> None:
    sent = stream()
    out = replay(pipeline("nginx-streaming"), sent)
    assert down_times(out) == [t for t, i in sent if i.direction is DOWN]


def test_nginx_gzip_holds_the_whole_compressed_stream_until_the_end() -> None:
    sent = stream()
    out = replay(pipeline("nginx-gzip"), sent)
    wire = down_bytes(out)
    assert set(down_times(out)) == {sent[-1][0]}  # one burst, when the upstream ended
    head, _, _ = wire.partition(b"\r\n\r\n")
    assert b"content-encoding: gzip" in head.lower()
    ((body, complete),) = dechunked(wire)
    assert complete
    assert gzip.decompress(body).count(b"data: ") == 61


def test_haproxy_default_sends_full_segments_of_a_fast_stream() -> None:
    sent = stream()
    out = replay(pipeline("haproxy-default"), sent)
    writes = [i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN]
    assert all(len(w) % 1448 == 0 for w in writes[:-1])  # a corked socket sends full MSS
    assert len(writes) < len(TOKENS) / 3
    assert down_bytes(out) == down_bytes(sent)


def test_haproxy_default_holds_a_slow_stream_for_200_ms_from_the_first_held_byte() -> None:
    sent = timeline(sse_response(*[t[:20] for t in TOKENS[:8]]), step=0.05)
    out = replay(pipeline("haproxy-default"), sent)
    assert down_times(out)[:2] == [pytest.approx(0.05 + 0.2), pytest.approx(0.25 + 0.2)]
    assert down_bytes(out) == down_bytes(sent)


def test_haproxy_default_learns_the_client_left_when_a_write_after_the_cork_fails() -> None:
    sent = [*stream()[:11], (11 * ITL + 0.001, Eof(UP)), *stream()[11:]]
    out = replay(pipeline("haproxy-default"), sent)
    (when, _), *_ = [(t, i) for t, i in out if isinstance(i, Reset) and i.direction is UP]
    assert 0.2 <= when - 11 * ITL <= 0.2 + 2 * ITL  # measured: 224 ms, 12 tokens


def test_apache_default_flushes_each_write_and_learns_at_the_second_write_after_a_fin() -> None:
    sent = [*stream()[:11], (11 * ITL + 0.001, Eof(UP)), *stream()[11:]]
    out = replay(pipeline("apache-default"), sent)
    assert down_times(out) == [t for t, i in sent if i.direction is DOWN and t < 11 * ITL + 0.001]
    resets = [t for t, i in out if isinstance(i, Reset) and i.direction is UP]
    assert resets == [pytest.approx(13 * ITL)]  # measured: 38 ms, 2 tokens


def test_caddy_default_and_nginx_pass_the_clients_close_to_the_upstream_at_once() -> None:
    for name in ("caddy-default", "nginx-default", "nginx-streaming"):
        sent = [*stream()[:11], (11 * ITL + 0.001, Eof(UP)), *stream()[11:]]
        out = replay(pipeline(name), sent)
        assert (11 * ITL + 0.001, Eof(UP)) in out, name


@pytest.mark.parametrize(
    ("name", "timeout"), [("haproxy-default", 50.0), ("apache-default", 300.0)]
)
def test_the_default_read_timeout_ends_a_silent_stream_without_the_last_chunk(
    name: str, timeout: float
) -> None:
    sent = timeline(sse_response(*TOKENS[:10], done=False), step=ITL)
    out = replay(pipeline(name), sent, until=1000.0)
    assert [t for t, i in ends(out) if i == Eof(DOWN)] == [pytest.approx(sent[-1][0] + timeout)]
    ((body, complete),) = dechunked(down_bytes(out))
    assert not complete and body.count(b"data: ") == 10
