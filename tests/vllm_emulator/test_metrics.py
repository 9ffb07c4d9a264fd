"""metrics.py: the families a real vLLM 0.32.0 pre-creates, and the mirrors that keep them true.

The expected names, types and labels are those of the running 0.32.0 CPU server's /metrics
(tests/real_vllm/test_conformance.py compares the whole exposition live).
"""

from __future__ import annotations

import re

from vllm_emulator.metrics import Histogram, Registry, declare_profile_families


def _registry(profile: str) -> Registry:
    registry = Registry("chat", 1.0)
    declare_profile_families(registry, profile, 128, 8192, 8192)  # type: ignore[arg-type]
    return registry


def _types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


REAL_032_EXTRA = {
    "vllm:estimated_flops_per_gpu_total": "counter",
    "vllm:estimated_read_bytes_per_gpu_total": "counter",
    "vllm:estimated_write_bytes_per_gpu_total": "counter",
    "vllm:engine_sleep_state": "gauge",
    "vllm:external_prefix_cache_queries_total": "counter",
    "vllm:external_prefix_cache_hits_total": "counter",
    "vllm:mm_cache_queries_total": "counter",
    "vllm:mm_cache_hits_total": "counter",
    "vllm:prompt_tokens_by_source_total": "counter",
    "vllm:prompt_tokens_cached_total": "counter",
    "vllm:prompt_tokens_cached_by_source_total": "counter",
    "vllm:admission_rejections_total": "counter",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:request_num_preemptions": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:cache_config_info": "gauge",
}


def test_032_declares_the_families_the_real_server_has() -> None:
    types = _types(_registry("vllm-0.32").render())
    assert {name: types.get(name) for name in REAL_032_EXTRA} == REAL_032_EXTRA


def test_033_declares_only_the_families_its_reference_lists() -> None:
    types = _types(_registry("vllm-0.33").render())
    assert "vllm:engine_sleep_state" in types and "vllm:iteration_tokens_total" in types
    assert "vllm:estimated_flops_per_gpu_total" not in types
    assert "vllm:mm_cache_hits_total" not in types
    assert set(_types(_registry("vllm-0.11").render())) == {"vllm:cache_config_info"}


def test_032_labels_as_the_real_server_writes_them() -> None:
    text = _registry("vllm-0.32").render()
    assert (
        'vllm:admission_rejections_total{model_name="chat",reason="max_num_queued_reqs"} 0.0'
        in text.splitlines()
    )  # by model only: no engine label
    assert 'vllm:engine_sleep_state{engine="0",model_name="chat",sleep_state="awake"} 1.0' in text
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert 'block_size="128"' in info and 'kv_cache_size_tokens="1048576"' in info
    assert 'kv_cache_max_concurrency="128.0"' in info and 'num_gpu_blocks="8192"' in info
    assert len(re.findall(r'\w+="', info)) == 37  # 36 CacheConfig fields + engine (no model_name)


def test_mirrors_follow_prompt_tokens_exactly() -> None:
    registry = _registry("vllm-0.32")
    registry.counter("vllm:prompt_tokens", "", 7.0)
    registry.histogram("vllm:request_prompt_tokens", "", (1.0, 10.0), 7.0)
    assert registry.value("vllm:prompt_tokens_by_source", source="local_compute") == 7.0
    assert registry.value("vllm:prompt_tokens_by_source", source="local_cache_hit") == 0.0
    computed = registry.value("vllm:request_prefill_kv_computed_tokens")
    preemptions = registry.value("vllm:request_num_preemptions")
    assert isinstance(computed, Histogram) and (computed.count, computed.total) == (1, 7.0)
    assert isinstance(preemptions, Histogram) and (preemptions.count, preemptions.total) == (1, 0)
