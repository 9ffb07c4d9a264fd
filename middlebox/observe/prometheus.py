"""The one reader of the Prometheus text exposition format (version 0.0.4), pure.

Used for vLLM's `/metrics` (a real server scored with `--upstream`: tokens generated around
each client) and for the proxy's own control API `/metrics` in tests. A sample line is
`name{label="value",...} value [timestamp]`; `#` lines are HELP/TYPE comments. Label values
may hold spaces, so the name-and-labels part ends at the closing brace, not at a space.
"""

from __future__ import annotations


def _split(line: str) -> tuple[str, float] | None:
    """(`name{labels}`, value) of one sample line, or None for a line that is not one."""
    brace = line.find("{")
    if brace != -1 and brace < (line.find(" ") if " " in line else len(line)):
        close = line.rfind("}")
        if close == -1:
            return None
        series, rest = line[: close + 1], line[close + 1 :]
    else:
        series, _, rest = line.partition(" ")
    fields = rest.split()
    if not series or not fields:
        return None
    try:
        # float() reads the format's NaN, +Inf and -Inf as written by prometheus_client
        return series, float(fields[0])
    except ValueError:
        return None


def parse_text(text: str) -> dict[str, float]:
    """Every sample: `name{labels}` (exactly as written) -> value; unreadable lines skipped."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        sample = _split(line.strip())
        if sample is not None:
            samples[sample[0]] = sample[1]
    return samples


def totals(text: str) -> dict[str, float]:
    """Each metric's value summed over its label sets (vLLM labels by model and engine)."""
    summed: dict[str, float] = {}
    for series, value in parse_text(text).items():
        name = series.split("{", 1)[0]
        summed[name] = summed.get(name, 0.0) + value
    return summed
