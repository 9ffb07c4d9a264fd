"""vLLM's Prometheus metrics at /metrics: names, types, labels, buckets (pure).

Follows vLLM 0.33 `vllm/v1/metrics/loggers.py` as exposed by prometheus_client's
text format (reference §4): labels `engine` and `model_name` (sorted in the
exposition), counters named `..._total` with a `..._created` gauge family,
histograms with `_bucket{le=...}`, `_count`, `_sum` and `_created`, values
printed like Go floats (`1.0`, `+Inf`). `request_success_total` is pre-created
for every finished reason. The quirks are the caller's job (see engine.py): client
aborts never reach `request_success_total{finished_reason="abort"}` nor the
per-request histograms, while tokens already produced stay counted.

`declare_profile_families` adds what the engine does not drive itself, per profile:
the families the reference lists for 0.33 (sleep state, prompt tokens by source,
admission rejections, per-step and per-request token histograms) and, for 0.32, the
further ones and the full `cache_config_info` a running vLLM 0.32.0 exposes
(checked by tests/real_vllm/test_conformance.py). The emulator has no prefix cache
hits and no preemption, so some of them follow others exactly (`Registry.mirror`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field

from vllm_emulator import host
from vllm_emulator.wire import Profile, modern

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# vLLM's fixed per-step buckets (cudagraph capture sizes) and preemption-count buckets.
ITERATION_TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
                           4096.0, 8192.0, 16384.0)  # fmt: skip
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, ... up to the limit."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


def go_float(value: float) -> str:
    """prometheus_client's floatToGoString."""
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
    return "{" + inner + "}"


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        """Count into the first bucket that holds it (cumulated when rendered)."""
        self.count += 1
        self.total += value
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.buckets):
            self.counts[index] += 1

    def cumulative(self) -> list[int]:
        return list(itertools.accumulate(self.counts))


@dataclass
class _Family:
    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    created: float
    series: dict[tuple[tuple[str, str], ...], float | Histogram] = field(default_factory=dict)
    buckets: tuple[float, ...] = ()


class Registry:
    """The emulator's metric families, written in prometheus_client's text format."""

    def __init__(self, model_name: str, created: float, engine: str = "0") -> None:
        self.base = {"model_name": model_name, "engine": engine}
        self.created = created
        self.families: dict[str, _Family] = {}
        self._base_key = tuple(sorted(self.base.items()))
        # family -> (family, labels, fixed value or None to copy) it also moves
        self.mirrors: dict[str, list[tuple[str, dict[str, str], float | None]]] = {}

    def mirror(
        self, from_family: str, to_family: str, fixed: float | None = None, **labels: str
    ) -> None:
        """Every later counter increment or histogram observation of `from_family` also goes
        to `to_family` (with `labels`), as `fixed` if given, else the same amount."""
        self.mirrors.setdefault(from_family, []).append((to_family, labels, fixed))

    def _family(self, name: str, kind: str, help: str, buckets: tuple[float, ...] = ()) -> _Family:
        family = self.families.get(name)
        if family is None:
            family = _Family(name, kind, help, self.created, buckets=buckets)
            self.families[name] = family
        return family

    def _key(
        self, extra: dict[str, str] | None, without: tuple[str, ...] = ()
    ) -> tuple[tuple[str, str], ...]:
        if not extra and not without:
            return self._base_key
        merged = {**self.base, **(extra or {})}
        return tuple(sorted((k, v) for k, v in merged.items() if k not in without))

    def counter(
        self,
        name: str,
        help: str,
        amount: float = 1.0,
        *,
        without: tuple[str, ...] = (),
        **labels: str,
    ) -> None:
        """Add to a counter series; `without` drops base labels a few vLLM families lack."""
        self._add(name, help, self._key(labels, without), amount)

    def _add(self, name: str, help: str, key: tuple[tuple[str, str], ...], amount: float) -> None:
        family = self._family(name, "counter", help)
        family.series[key] = float(family.series.get(key, 0.0)) + amount  # type: ignore[arg-type]
        for target, labels, fixed in self.mirrors.get(name, ()):
            self._add(target, "", self._key(labels), amount if fixed is None else fixed)

    def gauge(
        self, name: str, help: str, value: float, *, without: tuple[str, ...] = (), **labels: str
    ) -> None:
        self._family(name, "gauge", help).series[self._key(labels, without)] = float(value)

    def histogram(
        self, name: str, help: str, buckets: tuple[float, ...], value: float | None = None
    ) -> None:
        """Create (and with `value`, observe into) a histogram series."""
        family = self._family(name, "histogram", help, buckets)
        key = self._key(None)
        series = family.series.get(key)
        if not isinstance(series, Histogram):
            series = Histogram(buckets)
            family.series[key] = series
        if value is not None:
            series.observe(value)
            for target, _, fixed in self.mirrors.get(name, ()):
                self.histogram(target, "", (), value if fixed is None else fixed)

    def value(self, name: str, **labels: str) -> float | Histogram | None:
        family = self.families.get(name)
        return None if family is None else family.series.get(self._key(labels))

    def render(self) -> str:
        out: list[str] = []
        for family in self.families.values():
            exposed = family.name + ("_total" if family.kind == "counter" else "")
            out.append(f"# HELP {exposed} {family.help}")
            out.append(f"# TYPE {exposed} {family.kind}")
            created: list[str] = []
            for key, series in family.series.items():
                labels = dict(key)
                created.append(f"{family.name}_created{_labels(labels)} {go_float(family.created)}")
                if isinstance(series, Histogram):
                    for bound, count in zip(series.buckets, series.cumulative(), strict=True):
                        le = {**labels, "le": go_float(bound)}
                        out.append(f"{family.name}_bucket{_labels(le)} {go_float(count)}")
                    inf = {**labels, "le": "+Inf"}
                    out.append(f"{family.name}_bucket{_labels(inf)} {go_float(series.count)}")
                    out.append(f"{family.name}_count{_labels(labels)} {go_float(series.count)}")
                    out.append(f"{family.name}_sum{_labels(labels)} {go_float(series.total)}")
                else:
                    out.append(f"{exposed}{_labels(labels)} {go_float(series)}")
            if family.kind in ("counter", "histogram") and created:
                out.append(f"# HELP {family.name}_created {family.help}")
                out.append(f"# TYPE {family.name}_created gauge")
                out.extend(created)
        return "\n".join(out) + "\n"


_SLEEP_HELP = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
)
_CACHED_BY_SOURCE_HELP = (
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
    "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
    "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
    "vllm:external_prefix_cache_hits."
)
_MFU = "(for Model Flops Utilization calculations)."
WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
    "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
    "blocked status). Sum of all reasons equals vllm:num_requests_waiting."
)


def cache_config_labels(
    profile: Profile,
    block_size: int,
    num_gpu_blocks: int,
    max_model_len: int,
    cpu_flags: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """`vllm:cache_config_info`'s labels: 0.32 writes every CacheConfig field (`metrics_info`:
    `str()` of each), here with the values the real 0.32.0 CPU server reports except the
    emulator's own block size, block count and what follows from them, and what the CPU
    platform sets from the host's `cpu_flags` (host.py). Other profiles: block_size and
    num_gpu_blocks only (the reference gives no literal)."""
    if profile != "vllm-0.32":
        return {"block_size": str(block_size), "num_gpu_blocks": str(num_gpu_blocks)}
    size_tokens = block_size * num_gpu_blocks
    return {
        "_block_size_resolved": "True", "block_size": str(block_size), "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None", "effective_attention_block_size": str(block_size),
        "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.92", "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None", "kv_cache_max_concurrency": repr(size_tokens / max_model_len),
        "kv_cache_memory_bytes": "1073741824",  # the CPU build's 1 GiB KV space
        "kv_cache_size_tokens": str(size_tokens), "kv_offloading_backend": "native",
        "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": host.mamba_ssm_cache_dtype(cpu_flags),
        "num_cpu_blocks": "None", "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": "None", "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None",
        "replayssm_buffer_len": "16", "skip_page_size_padded": "None", "sliding_window": "None",
        "swa_bounded_replay": "True", "use_kda_recoverssm": "False", "use_replayssm": "False",
        "user_specified_block_size": "False",
    }  # fmt: skip


def waiting_by_reason(profile: Profile) -> bool:
    """`vllm:num_requests_waiting_by_reason{reason=capacity|deferred}`: 0.32 and 0.33."""
    return modern(profile)


def declare_profile_families(
    registry: Registry,
    profile: Profile,
    block_size: int,
    num_gpu_blocks: int,
    max_model_len: int,
    cpu_flags: frozenset[str] = frozenset(),
) -> None:
    """The families vLLM pre-creates that the engine does not drive, at vLLM's start values.

    Mirrors keep the ones the emulator can know exact: every prompt token is computed
    locally (no prefix cache hits: `prompt_tokens_by_source{source="local_compute"}` is
    `prompt_tokens`, `request_prefill_kv_computed_tokens` is `request_prompt_tokens`) and
    no request is preempted (`request_num_preemptions` observes 0 per finished request).
    `iteration_tokens_total` (tokens per engine step) is declared but not observed.
    """
    info = cache_config_labels(profile, block_size, num_gpu_blocks, max_model_len, cpu_flags)
    # 0.32 labels it by engine only (vLLM's info gauge carries no model_name).
    without = ("model_name",) if profile == "vllm-0.32" else ()
    registry.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", 1.0,
                   without=without, **info)  # fmt: skip
    if not modern(profile):
        return
    r = registry
    if profile == "vllm-0.32":
        for kind, what in (("flops", "floating point operations"), ("read_bytes", "bytes read "
                           "from memory"), ("write_bytes", "bytes written to memory")):  # fmt: skip
            r.counter(f"vllm:estimated_{kind}_per_gpu",
                      f"Estimated number of {what} per GPU {_MFU}", 0.0)  # fmt: skip
    for state, value in (("awake", 1.0), ("weights_offloaded", 0.0), ("discard_all", 0.0)):
        r.gauge("vllm:engine_sleep_state", _SLEEP_HELP, value, sleep_state=state)
    if profile == "vllm-0.32":
        external = "from KV connector cross-instance cache sharing, in terms of number of"
        r.counter("vllm:external_prefix_cache_queries",
                  f"External prefix cache queries {external} queried tokens.", 0.0)  # fmt: skip
        r.counter("vllm:external_prefix_cache_hits",
                  f"External prefix cache hits {external} cached tokens.", 0.0)  # fmt: skip
        for kind, what in (("queries", "queries, in terms of number of queried"),
                           ("hits", "hits, in terms of number of cached")):  # fmt: skip
            r.counter(f"vllm:mm_cache_{kind}", f"Multi-modal cache {what} items.", 0.0)
    for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        r.counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", 0.0,
                  source=source)  # fmt: skip
    r.mirror("vllm:prompt_tokens", "vllm:prompt_tokens_by_source", source="local_compute")
    r.counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
              0.0)  # fmt: skip
    if profile == "vllm-0.32":
        for source in ("device", "host", "p2p", "disk", "external_unspecified"):
            r.counter("vllm:prompt_tokens_cached_by_source", _CACHED_BY_SOURCE_HELP, 0.0,
                      source=source)  # fmt: skip
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        r.counter("vllm:admission_rejections",
                  "Number of admission attempts rejected by a queue limit, by reason.", 0.0,
                  without=("engine",), reason=reason)  # fmt: skip
    r.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                ITERATION_TOKEN_BUCKETS)  # fmt: skip
    preempted = "Histogram of the number of times a request was preempted."
    r.histogram("vllm:request_num_preemptions", preempted, PREEMPTION_BUCKETS)
    r.histogram("vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                token_buckets(max_model_len))  # fmt: skip
    r.mirror("vllm:request_prompt_tokens", "vllm:request_prefill_kv_computed_tokens")
    r.mirror("vllm:request_prompt_tokens", "vllm:request_num_preemptions", 0.0)
