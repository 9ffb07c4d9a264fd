"""vLLM's Prometheus metrics at /metrics: names, types, labels, buckets (pure).

Follows vLLM 0.33 `vllm/v1/metrics/loggers.py` as exposed by prometheus_client's
text format (reference §4): labels `engine` and `model_name` (sorted in the
exposition), counters named `..._total` with a `..._created` gauge family,
histograms with `_bucket{le=...}`, `_count`, `_sum` and `_created`, values
printed like Go floats (`1.0`, `+Inf`). `request_success_total` is pre-created
for every finished reason. The quirks are the caller's job (see engine.py): client
aborts never reach `request_success_total{finished_reason="abort"}` nor the
per-request histograms, while tokens already produced stay counted.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


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

    def _family(self, name: str, kind: str, help: str, buckets: tuple[float, ...] = ()) -> _Family:
        family = self.families.get(name)
        if family is None:
            family = _Family(name, kind, help, self.created, buckets=buckets)
            self.families[name] = family
        return family

    def _key(self, extra: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
        if not extra:
            return self._base_key
        return tuple(sorted({**self.base, **extra}.items()))

    def counter(self, name: str, help: str, amount: float = 1.0, **labels: str) -> None:
        family = self._family(name, "counter", help)
        key = self._key(labels)
        family.series[key] = float(family.series.get(key, 0.0)) + amount  # type: ignore[arg-type]

    def gauge(self, name: str, help: str, value: float, **labels: str) -> None:
        self._family(name, "gauge", help).series[self._key(labels)] = float(value)

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
