"""What a vLLM CPU build reads from the host it runs on, and what it then reports.

vLLM 0.32's CPU platform (`vllm/platforms/cpu.py`) and worker (`vllm/v1/worker/cpu_worker.py`)
set parts of their configuration from the machine: its CPU flags, core count and memory. Some of
those values reach the wire (`/metrics`' `cache_config_info`, `system_fingerprint`), so one real
server answers differently on an AVX2 host and on an AVX-512 BF16 one. `HOST_VALUES` lists each,
with the line of vLLM that sets it and how the `vllm-0.32` profile and the conformance test
(tests/real_vllm/wirecompare.py) treat it: `modelled` (the emulator reports what vLLM would on
the host it runs on), `pinned` (the tier starts vLLM so that the value is the same on every host)
or `masked` (not knowable from outside vLLM: the comparison leaves it out), or `off the wire`.

Pure except `this_host_cpu_flags`, which reads /proc/cpuinfo once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Handling = Literal["modelled", "pinned", "masked", "off the wire"]


@dataclass(frozen=True)
class HostValue:
    """One value a real vLLM 0.32 CPU server takes from its host."""

    what: str
    source: str
    handling: Handling
    how: str


HOST_VALUES: tuple[HostValue, ...] = (
    HostValue(
        "cache_config_info{mamba_ssm_cache_dtype}",
        "vllm/platforms/cpu.py:302-316",
        "modelled",
        "on a CPU with AVX-512 BF16 the platform resets any dtype but float16/bfloat16 for its "
        "accelerated GDN backend to float32, so `auto` reads `float32` there; the emulator reads "
        "the flag from /proc/cpuinfo (`cpu_flags` in its config overrides)",
    ),
    HostValue(
        "cache_config_info{kv_cache_memory_bytes, kv_cache_size_tokens, "
        "kv_cache_max_concurrency}, num_gpu_blocks",
        "vllm/v1/worker/cpu_worker.py:213-240, vllm/platforms/cpu.py:323-327",
        "pinned",
        "without an explicit size the worker takes gpu_memory_utilization of the node's memory "
        "less its own RSS; realvllm.serve sets VLLM_CPU_KVCACHE_SPACE=1 (1 GiB on every host), "
        "and num_gpu_blocks is masked as a deployment's number",
    ),
    HostValue(
        "cache_config_info{block_size}",
        "vllm/platforms/cpu.py:246-293",
        "pinned",
        "128 tokens unless the model uses MLA (16, or 256 with AMX tiles) or DeepSeek-V4; the "
        "tier's model uses neither, and the emulator runs with `kv_block_size: 128`",
    ),
    HostValue(
        "system_fingerprint (its hash)",
        "vllm/entrypoints/serve/utils/fingerprint.py:61",
        "masked",
        "`vllm_config.compute_hash()` covers the cache config above, so the hash moves with "
        "the host; wirecompare masks the hash and keeps `vllm-0.32.0-`",
    ),
    HostValue(
        "the kernel library (_C, _C_AVX512 or _C_AVX2)",
        "vllm/platforms/cpu.py:631-660",
        "masked",
        "other kernels round differently, so greedy text and token ids may differ between hosts; "
        "text and token counts are masked; the stop-string case takes its stop string from "
        "each server's own text, for the first prompt whose greedy answer has a letter on both; "
        "the cases that need an end by EOS (`completed`, `end_turn`) ask the first of "
        "`tests/real_vllm/cases.py` `NATURAL_PROMPTS` whose greedy answer ends by EOS within 64 "
        "tokens, with text, on that server (`wirecompare.first_ending_by_eos`; on the tier's "
        "host 4 of the first 15 do)",
    ),
    HostValue(
        "threads (torch.get_num_threads, the OpenMP binding by core count)",
        "vllm/platforms/cpu.py:94-100, 627-628",
        "off the wire",
        "only the speed: a run against a real server measures the pace first "
        "(`middlebox.run.upstream.apace`)",
    ),
    HostValue(
        "VLLM_SSM_CONV_STATE_LAYOUT",
        "vllm/platforms/cpu.py:426-439",
        "off the wire",
        "SD on AVX-512 BF16: a Mamba state layout, which a model without Mamba layers never shows",
    ),
    HostValue(
        "process_* metrics (RSS, CPU seconds, open fds)",
        "prometheus_client's ProcessCollector",
        "masked",
        "wirecompare compares only `vllm:` families",
    ),
)


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The `flags` of the first processor in a /proc/cpuinfo text (x86; empty elsewhere)."""
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.cache
def this_host_cpu_flags() -> frozenset[str]:
    try:
        return parse_cpu_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return frozenset()


def mamba_ssm_cache_dtype(cpu_flags: frozenset[str], configured: str = "auto") -> str:
    """What 0.32's CPU platform leaves in `cache_config.mamba_ssm_cache_dtype`
    (vllm/platforms/cpu.py:302-316; `torch.cpu._is_avx512_bf16_supported()` is the CPU's
    AVX-512 BF16 flag). Only a Mamba model whose state dtype is the configured float16 or
    bfloat16 keeps it (the GDN backend); the emulator serves no Mamba layers, so on such a CPU
    anything but float32 becomes float32."""
    if "avx512_bf16" in cpu_flags and configured != "float32":
        return "float32"
    return configured
