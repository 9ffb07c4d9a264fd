"""host.py: what a vLLM CPU build takes from its host, as the `vllm-0.32` profile reports it.

A real 0.32.0 CPU server on an AVX-512 BF16 host reports `mamba_ssm_cache_dtype="float32"` in
`cache_config_info`, and `"auto"` on an AVX2 host (both seen by tests/real_vllm on hosts of each
kind); the emulator reports the one of the host it runs on, or of the flags it is given.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_emulator import host
from vllm_emulator.config import EmulatorConfig
from vllm_emulator.engine import Engine
from vllm_emulator.metrics import Registry, declare_profile_families

ROOT = Path(__file__).resolve().parents[2]
AVX2 = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})
AVX512_BF16 = AVX2 | {"avx512f", "avx512vl", "avx512_bf16", "amx_bf16"}
CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse4_2 avx avx2 avx512f avx512_bf16 amx_bf16
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu
"""


def _info_label(text: str, label: str) -> str:
    line = next(li for li in text.splitlines() if li.startswith("vllm:cache_config_info{"))
    found = re.search(rf'\b{label}="([^"]*)"', line)
    assert found, line
    return found.group(1)


def _metrics(profile: str, flags: frozenset[str]) -> str:
    registry = Registry("chat", 1.0)
    declare_profile_families(registry, profile, 128, 8192, 8192, flags)  # type: ignore[arg-type]
    return registry.render()


def test_cpuinfo_flags_are_the_first_processors() -> None:
    flags = host.parse_cpu_flags(CPUINFO)
    assert "avx512_bf16" in flags and "avx2" in flags and "spectre_v1" not in flags
    assert host.parse_cpu_flags("processor : 0\nmodel name : ARM\n") == frozenset()


@pytest.mark.parametrize(
    ("flags", "configured", "expected"),
    [
        (AVX2, "auto", "auto"),
        (AVX512_BF16, "auto", "float32"),
        (AVX512_BF16, "float32", "float32"),
        (AVX512_BF16, "bfloat16", "float32"),  # no GDN backend without Mamba layers
        (AVX2, "bfloat16", "bfloat16"),
        (frozenset(), "auto", "auto"),
    ],
)
def test_mamba_ssm_cache_dtype_follows_vllms_cpu_platform(
    flags: frozenset[str], configured: str, expected: str
) -> None:
    assert host.mamba_ssm_cache_dtype(flags, configured) == expected


def test_the_032_profile_reports_the_hosts_dtype_and_others_do_not_show_it() -> None:
    assert _info_label(_metrics("vllm-0.32", AVX2), "mamba_ssm_cache_dtype") == "auto"
    assert _info_label(_metrics("vllm-0.32", AVX512_BF16), "mamba_ssm_cache_dtype") == "float32"
    # every other label is the same on both hosts
    avx2, avx512 = _metrics("vllm-0.32", AVX2), _metrics("vllm-0.32", AVX512_BF16)
    assert avx2.replace('mamba_ssm_cache_dtype="auto"', 'mamba_ssm_cache_dtype="float32"') == avx512
    assert "mamba_ssm_cache_dtype" not in _metrics("vllm-0.33", AVX512_BF16)


def test_the_engine_reads_this_hosts_flags_unless_configured() -> None:
    on_this_host = Engine(EmulatorConfig(profile="vllm-0.32")).metrics.render()
    expected = host.mamba_ssm_cache_dtype(host.parse_cpu_flags(Path("/proc/cpuinfo").read_text()))
    assert _info_label(on_this_host, "mamba_ssm_cache_dtype") == expected
    for flags, dtype in ((["avx2"], "auto"), (["avx2", "avx512_bf16"], "float32")):
        engine = Engine(EmulatorConfig(profile="vllm-0.32", cpu_flags=flags))
        assert _info_label(engine.metrics.render(), "mamba_ssm_cache_dtype") == dtype


def test_docs_list_every_host_dependent_value_with_its_source_line() -> None:
    docs = (ROOT / "docs" / "emulator.md").read_text()
    section = docs.split("### Values that depend on the host", 1)[1].split("\n## ", 1)[0]
    for value in host.HOST_VALUES:
        assert value.what in section, value.what
        assert value.source in section, value.source
        assert f"**{value.handling}**" in section, value.handling
