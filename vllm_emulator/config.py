"""The emulator's configuration: one frozen dataclass, loadable from YAML.

Field types are limited to what the scenario loader understands (bool, int,
float, str, Literal, `Annotated[float, "seconds"]`, `Annotated[int, "bytes"]`,
`X | None`, lists and nested dataclasses), because a scenario's `upstream:` block
is validated against this class by its annotations. `--config FILE` takes the
same keys; durations may be written `800ms`, sizes `1MiB`.

The defaults describe a small model on one GPU: TTFT about 120-300 ms, ITL about
30 ms (a 100-token answer takes ~3 s), vLLM 0.33's wire format, abort on
disconnect, no keep-alive comments, no resumable streams.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

Seconds = Annotated[float, "seconds"]
Bytes = Annotated[int, "bytes"]
ProfileName = Literal["vllm-0.33", "vllm-0.32", "vllm-0.11"]


@dataclass(frozen=True)
class PauseConfig:
    """After `after_tokens` tokens of every sequence, stall `duration` (a tool call, say)."""

    after_tokens: int = 1
    duration: Seconds = 0.0


@dataclass(frozen=True)
class EmulatorConfig:
    """Everything the emulator does differently from its defaults."""

    profile: ProfileName = "vllm-0.33"
    model: str = "middlebox/emulated-7b"
    # The CPU flags a vLLM CPU build would find (`vllm-0.32` reports what follows from them,
    # vllm_emulator/host.py); null: this host's, from /proc/cpuinfo.
    cpu_flags: list[str] | None = None
    seed: int = 0
    max_model_len: int = 8192
    # Scheduler and timing (see schedule.py).
    max_num_seqs: int = 256
    prefill_overhead: Seconds = 0.12
    prefill_per_token: Seconds = 0.0002
    itl: Seconds = 0.03
    itl_jitter: float = 0.1
    batch_slowdown: float = 0.002
    kv_block_size: int = 16
    kv_num_blocks: int = 8192
    pauses: list[PauseConfig] = field(default_factory=list)
    # Generation length when a request gives no max_tokens: a seeded natural length
    # in [natural_length_min, natural_length_max] then EOS, capped by default_max_tokens.
    natural_length_min: int = 16
    natural_length_max: int = 256
    default_max_tokens: int | None = None
    # Pinned output, for golden tests and scenarios that need a known answer: `script`
    # lists the tokens every choice produces (then EOS); `created` pins the timestamp;
    # `system_fingerprint` "auto" is vllm-<version>-<hash8>, null is mode none (0.33 only).
    script: list[str] | None = None
    created: int | None = None
    system_fingerprint: str | None = "auto"
    # HTTP behaviour.
    sse_keep_alive_interval: Seconds = 0.0
    # uvicorn closes an idle keep-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s).
    http_keep_alive_timeout: Seconds = 5.0
    abort_on_disconnect: bool = True
    # A retry draws anew, as vLLM's sampler does: a request repeated without `seed` at
    # temperature > 0 (vLLM's default is 1.0) continues differently (textgen.samples).
    retries_resample: bool = True
    enable_request_id_headers: bool = False
    stale_gauges: bool = False
    log_requests: bool = False
    # The Responses API's store (vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1): off, as in vLLM,
    # a `background` request is refused and `store` ignored; on, responses are kept for
    # `GET /v1/responses/{id}` and background ones run on after their client leaves.
    responses_store: bool = False
    # Responses and Messages answers end at their natural length (EOS, in
    # natural_length_min..max) under their limit, as the real-vLLM tier's tiny model does;
    # off, a limit given is generated in full, as a chat max_tokens always is here, so a
    # scenario's workload asks for the same generation in every API.
    natural_ends: bool = False
    # Resumable streams (a gateway pattern vLLM lacks; off like vLLM).
    resumable: bool = False
    resume_buffer_size: Bytes = 1024 * 1024
    resume_ttl: Seconds = 60.0
    # Replay a recorded response instead of generating.
    cassette: str | None = None
    # Fail generation after this many tokens with an in-band error (tests, incidents).
    fail_after_tokens: int | None = None
    fail_kind: Literal["generation", "retryable", "engine_dead"] = "generation"
    # --max-num-queued-reqs (0.33): more waiting sequences than this get a 503 up front.
    max_num_queued_reqs: int | None = None
    # Agent output (agent.py, chat only): a reasoning parser's phase of this many reasoning
    # tokens before every answer (0: no reasoning), and how many tool calls an `auto` or
    # `required` tool_choice makes, cycling through the request's tools (a named one: one).
    reasoning_tokens: int = 0
    tool_calls_per_response: int = 1

    def __post_init__(self) -> None:
        problems = []
        for name in ("max_model_len", "max_num_seqs", "kv_block_size", "kv_num_blocks"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("prefill_overhead", "prefill_per_token", "itl", "itl_jitter"):
            if getattr(self, name) < 0:
                problems.append(f"{name} cannot be negative, got {getattr(self, name)}")
        if not 1 <= self.natural_length_min <= self.natural_length_max:
            problems.append(
                "natural_length_min must be at least 1 and at most natural_length_max, got "
                f"{self.natural_length_min}..{self.natural_length_max}"
            )
        if self.kv_block_size * self.kv_num_blocks < self.max_model_len:
            problems.append(
                f"the KV cache ({self.kv_num_blocks} blocks of {self.kv_block_size} tokens) "
                f"cannot hold one max_model_len={self.max_model_len} sequence"
            )
        if self.reasoning_tokens < 0:
            problems.append(f"reasoning_tokens cannot be negative, got {self.reasoning_tokens}")
        if self.tool_calls_per_response < 1:
            problems.append(
                f"tool_calls_per_response must be at least 1, got {self.tool_calls_per_response}"
            )
        if self.fail_after_tokens is not None and self.fail_after_tokens < 0:
            problems.append(f"fail_after_tokens cannot be negative, got {self.fail_after_tokens}")
        if problems:
            raise ValueError("; ".join(problems))


# ----------------------------------------------------------------- YAML loading

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|min|h)?\s*$")
_SIZE = re.compile(r"^\s*([0-9]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, None: 1.0}
_BYTES = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 1000**2,
          "GB": 1000**3, None: 1}  # fmt: skip
# The scenario grammar's bounds (middlebox.scenario.units): a day, a TiB.
_MAX_SECONDS = 86400.0
_MAX_BYTES = 1024**4


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, unit = typing.get_args(tp)[:2]
        if isinstance(value, bool):
            raise ValueError(f"{where}: expected a {unit} value, got {value!r}")
        if unit == "seconds":
            if isinstance(value, int | float):
                seconds = float(value)
            else:
                match = _DURATION.match(str(value))
                if not match:
                    raise ValueError(
                        f"{where}: expected a duration such as 250ms or 2s, got {value!r}"
                    )
                seconds = float(match.group(1)) * _SECONDS[match.group(2)]
            if not seconds <= _MAX_SECONDS:  # also catches inf and nan
                raise ValueError(f"{where}: a duration may be at most a day (24h), got {value!r}")
            return seconds
        if unit == "bytes":
            if isinstance(value, int):
                size = value
            else:
                match = _SIZE.match(str(value))
                if not match:
                    raise ValueError(f"{where}: expected a size such as 4KiB, got {value!r}")
                size = int(match.group(1)) * _BYTES[match.group(2)]
            if size > _MAX_BYTES:
                raise ValueError(f"{where}: a size may be at most 1TiB (1024GiB), got {value!r}")
            return size
        return _convert(value, base, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError("; ".join(errors))
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(c) for c in typing.get_args(tp))
            raise ValueError(f"{where}: {value!r} is not one of {choices}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return config_from_mapping(value, tp, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise ValueError(f"{where}: unsupported type {tp!r}")


def config_from_mapping(data: Any, cls: type[Any] = EmulatorConfig, where: str = "config") -> Any:
    """Build `cls` from a plain mapping (YAML/JSON), converting units; ValueError on junk."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {sorted(names)}")
    kwargs = {key: _convert(value, hints[key], f"{where}.{key}") for key, value in data.items()}
    return cls(**kwargs)


def config_to_mapping(config: EmulatorConfig) -> dict[str, Any]:
    """Plain data (seconds, bytes) that `config_from_mapping` and `--config` read back.

    A runner that got an EmulatorConfig from a scenario's `upstream:` block writes
    this as JSON (which is YAML) and starts `python -m vllm_emulator --config FILE`.
    """
    return dataclasses.asdict(config)


def load_config(path: str | Path, **overrides: Any) -> EmulatorConfig:
    """Read a YAML file of EmulatorConfig keys; `overrides` (e.g. from flags) win.

    Every problem, a YAML syntax error included, is a ValueError in one line that names
    the file (and the line and column where YAML knows them), as the scenario loader says it.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a YAML text file (not UTF-8)") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        detail = " ".join(part for part in (error.context, error.problem) if part)
        raise ValueError(f"{path}:{line}:{column}: YAML syntax error: {detail}") from None
    except yaml.YAMLError as error:  # ReaderError: NUL and other control characters
        position = getattr(error, "position", 0) or 0
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        reason = getattr(error, "reason", None) or str(error).splitlines()[0]
        raise ValueError(f"{path}:{line}:{column}: not a YAML text file: {reason}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of emulator settings")
    data.update({k: v for k, v in overrides.items() if v is not None})
    config: EmulatorConfig = config_from_mapping(data, EmulatorConfig, str(path))
    return config
