"""YAML scenarios: load, validate and describe them (pure).

A scenario names an incident and the faults that reproduce it, in path order,
client side first:

    name: nginx-default-buffering
    description: nginx's default proxy_buffering holds the whole stream.
    seed: 7
    path:
      - proxy_buffering: {buffer_size: 4KiB}
      - idle_reaper: {timeout: 60s}

Files are parsed with PyYAML's SafeLoader (no code execution) into nodes that keep
their marks, so every error names the file, line and column, the bad key or value,
and what was expected. Config types come from the fault dataclasses themselves:
`Seconds` accepts `800ms`/`2s`/`1.5min`, `Bytes` accepts `512B`/`4KiB`/`1MiB`,
`Literal[...]` lists its choices. The same machinery converts other sections
(`proxy:`, `upstream:`, `workload:`, `expect:`) when given a dataclass for them.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from middlebox.core.fault import Fault, Seconds, Unit

# ---------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario file, with where it is (1-based line/column)."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


class ScenarioError(ValueError):
    """Raised with every problem found in one file, so the user fixes them in one go."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda problem: (problem.line, problem.column))
        super().__init__("\n".join(str(problem) for problem in problems))


class _Collector:
    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []

    def add(self, node: yaml.Node | None, message: str) -> None:
        mark = node.start_mark if node is not None else None
        line = mark.line + 1 if mark is not None else 1
        column = mark.column + 1 if mark is not None else 1
        self.problems.append(Problem(self.file, line, column, message))


class _Invalid(Exception):
    """A value could not be converted; the caller records it and goes on."""


# A scenario is a page of YAML; anything this big is a mistake (or an attack), refused
# before parsing so a stray multi-gigabyte file cannot exhaust memory.
MAX_SCENARIO_BYTES = 1024 * 1024
# Nodes after expanding aliases: a "billion laughs" document is tiny but expands
# exponentially when walked as a tree, as the converters do.
MAX_EXPANDED_NODES = 100_000


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes walking `root` as a tree visits (aliases counted each time)."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        sizes[id(node)] = 1  # a recursive alias counts once instead of looping
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(key) + size(value) for key, value in node.value)
        sizes[id(node)] = min(total, MAX_EXPANDED_NODES + 1)
        return sizes[id(node)]

    return size(root)


# ----------------------------------------------------------------------------- units

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|min|h)?\s*$")
_SIZE = re.compile(r"^\s*([0-9]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_SECONDS_PER = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, None: 1.0}
_BYTES_PER = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    None: 1,
}


def parse_duration(value: object) -> float:
    """`250ms` → 0.25; a bare number is seconds. Raises ValueError with the valid units."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 250ms, 2s or 1.5min, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(
                f"expected a duration such as 250ms, 2s or 1.5min (units us, ms, s, min, h), "
                f"got {value!r}"
            )
        seconds = float(match.group(1)) * _SECONDS_PER[match.group(2)]
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def parse_size(value: object) -> int:
    """`4KiB` → 4096; a bare integer is bytes. Raises ValueError with the valid units."""
    if isinstance(value, bool | float):
        raise ValueError(f"expected a size such as 512B, 4KiB or 1MiB, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(
                f"expected a size such as 512B, 4KiB or 1MiB (units B, KiB, MiB, GiB, KB, MB, "
                f"GB), got {value!r}"
            )
        size = int(match.group(1)) * _BYTES_PER[match.group(2)]
    if size < 0:
        raise ValueError(f"a size cannot be negative, got {value!r}")
    return size


# ------------------------------------------------------------------ type conversion


def config_fields(cls: type) -> dict[str, tuple[dataclasses.Field[Any], Any]]:
    """The user-settable fields of a config dataclass with their resolved types."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def describe_type(tp: Any) -> str:
    """A short human name for a field type, used in errors and `middlebox schema`."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        unit = typing.get_args(tp)[1]
        return {Unit.SECONDS: "duration", Unit.BYTES: "size"}.get(unit, "value")
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(
            "null" if arg is type(None) else describe_type(arg) for arg in typing.get_args(tp)
        )
    if origin is list or origin is tuple:
        return f"list of {describe_type(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {describe_type(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return f"mapping ({tp.__name__})"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


class _Converter:
    def __init__(self, loader: yaml.SafeLoader, problems: _Collector) -> None:
        self.loader = loader
        self.problems = problems

    def scalar(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as error:
            # SafeLoader refuses !!python/* and unknown tags: a clear problem, never code.
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            self.problems.add(node, f"unsupported YAML value: {problem}")
            raise _Invalid from None

    def convert(self, node: yaml.Node, tp: Any, what: str) -> Any:
        """Convert `node` to `tp`, recording a problem (and raising _Invalid) if it won't go."""
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            base, unit = typing.get_args(tp)[:2]
            value = self._need_scalar(node, tp, what)
            try:
                if unit == Unit.SECONDS:
                    return parse_duration(value)
                if unit == Unit.BYTES:
                    return parse_size(value)
            except ValueError as error:
                self._fail(node, f"{what}: {error}")
            return self.convert(node, base, what)
        if origin in (typing.Union, types.UnionType):
            args = typing.get_args(tp)
            if (
                type(None) in args
                and isinstance(node, yaml.ScalarNode)
                and self.scalar(node) is None
            ):
                return None
            saved = len(self.problems.problems)
            for arg in args:
                if arg is type(None):
                    continue
                try:
                    return self.convert(node, arg, what)
                except _Invalid:
                    del self.problems.problems[saved:]
            self._fail(node, f"{what}: expected {describe_type(tp)}, got {self._show(node)}")
        if origin is Literal:
            choices = typing.get_args(tp)
            value = self._need_scalar(node, tp, what)
            if value not in choices and str(value) in choices:
                value = str(value)  # `status: 502` in YAML is an int; the choice is "502"
            if value not in choices:
                self._fail(
                    node,
                    f"{what}: {value!r} is not valid; choose one of "
                    + ", ".join(repr(choice) for choice in choices),
                )
            return value
        if origin in (list, tuple):
            if not isinstance(node, yaml.SequenceNode):
                self._fail(node, f"{what}: expected {describe_type(tp)}, got {self._show(node)}")
            (item_type, *_) = typing.get_args(tp)
            items = [
                self.convert(child, item_type, f"{what}[{i}]") for i, child in enumerate(node.value)
            ]
            return tuple(items) if origin is tuple else items
        if origin is dict:
            key_type, value_type = typing.get_args(tp)
            if not isinstance(node, yaml.MappingNode):
                self._fail(node, f"{what}: expected {describe_type(tp)}, got {self._show(node)}")
            return {
                self.convert(key, key_type, what): self.convert(
                    value, value_type, f"{what}.{self.scalar(key)}"
                )
                for key, value in node.value
            }
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.dataclass(node, tp, what)
        if tp is Any:
            return self.loader.construct_object(node, deep=True)
        value = self._need_scalar(node, tp, what)
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if tp in (bool, int, float, str) and (
            not isinstance(value, tp) or (tp is int and isinstance(value, bool))
        ):
            self._fail(node, f"{what}: expected {describe_type(tp)}, got {self._show(node)}")
        return value

    def fields_of(self, node: yaml.Node | None, cls: type, what: str) -> dict[str, Any]:
        """Convert a mapping node into keyword arguments for `cls`, checking every key."""
        known = config_fields(cls)
        if node is None or (isinstance(node, yaml.ScalarNode) and self.scalar(node) is None):
            return {}
        if not isinstance(node, yaml.MappingNode):
            self._fail(node, f"{what}: expected a mapping of its fields, got {self._show(node)}")
        kwargs: dict[str, Any] = {}
        bad = False
        for key_node, value_node in self.mapping_pairs(node, what):
            key = key_node.value
            if key not in known:
                self.problems.add(
                    key_node,
                    f"{what}: unknown field {key!r}; valid fields: "
                    + (
                        ", ".join(
                            f"{name} ({describe_type(tp)})" for name, (_, tp) in known.items()
                        )
                        or "none"
                    ),
                )
                bad = True
                continue
            try:
                kwargs[key] = self.convert(value_node, known[key][1], f"{what}.{key}")
            except _Invalid:
                bad = True
        if bad:
            raise _Invalid
        return kwargs

    def dataclass(self, node: yaml.Node | None, cls: type, what: str) -> Any:
        kwargs = self.fields_of(node, cls, what)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as error:
            self._fail(node, f"{what}: {error}")

    def mapping_pairs(self, node: yaml.MappingNode, what: str) -> list[tuple[yaml.Node, yaml.Node]]:
        seen: set[Any] = set()
        pairs: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.add(key_node, f"{what}: keys must be plain names")
                continue
            if key_node.value in seen:
                self.problems.add(key_node, f"{what}: duplicate key {key_node.value!r}")
                continue
            seen.add(key_node.value)
            pairs.append((key_node, value_node))
        return pairs

    def _need_scalar(self, node: yaml.Node, tp: Any, what: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self._fail(node, f"{what}: expected {describe_type(tp)}, got {self._show(node)}")
        return self.scalar(node)

    def _show(self, node: yaml.Node | None) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        if node is None:
            return "nothing"
        return repr(self.scalar(node))

    def _fail(self, node: yaml.Node | None, message: str) -> typing.NoReturn:
        self.problems.add(node, message)
        raise _Invalid


# --------------------------------------------------------------------------- scenario


@dataclass(frozen=True)
class FaultSpec:
    """One entry of `path:`: a fault class and its validated config, built per connection."""

    cls: type[Fault]
    config: Mapping[str, Any]
    line: int = 0

    @property
    def name(self) -> str:
        return self.cls.name

    def build(self) -> Fault:
        return self.cls(**self.config)


@dataclass(frozen=True)
class ProxyOptions:
    """How the proxy itself behaves, like a real proxy's defaults (nginx answers 502)."""

    on_upstream_unreachable: Literal["502", "reset", "close"] = "502"
    connect_timeout: Seconds = 5.0
    # nginx's client_header_timeout (60 s): a client that has not sent its first request
    # head by then is closed unanswered (slowloris); null waits forever.
    client_header_timeout: Seconds | None = 60.0
    # nginx's proxy_read_timeout, off unless set (middlebox is transparent unless told):
    # no upstream byte for this long with a request outstanding -> 504, or a close
    # mid-response.
    read_timeout: Seconds | None = None
    # Connections beyond this many at once are accepted and closed at once, and counted.
    max_connections: int | None = None

    def __post_init__(self) -> None:
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be at least 1 (or null for no limit)")
        for name in ("client_header_timeout", "read_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive (or null to turn it off)")


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. `sections` holds the converted optional blocks by name."""

    name: str
    description: str = ""
    seed: int = 0
    path: tuple[FaultSpec, ...] = ()
    proxy: ProxyOptions = field(default_factory=ProxyOptions)
    sections: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<string>"
    # Faults the scenario expects NOT to fire: it shows a fix keeps them quiet (heartbeats
    # keep an idle reaper from firing). The runner fails the run if one fires.
    quiet_faults: tuple[str, ...] = ()
    # Combinations that load but cannot do what they say (see scenario_warnings).
    warnings: tuple[Problem, ...] = ()

    def build_faults(self) -> list[Fault]:
        return [spec.build() for spec in self.path]


# Config fields that count SSE events of the response. A vLLM stream of max_tokens
# tokens has at most max_tokens + 4 events: the role chunk, one per token, the
# finish_reason chunk, the usage chunk and `data: [DONE]` (shared/reference/vllm-wire.md).
EVENT_COUNT_FIELDS = ("after_events", "at_event", "after_event", "event", "events")
EVENTS_BEYOND_TOKENS = 4
_COUNTS = ("events", "tokens")


def scenario_warnings(scenario: Scenario) -> list[Problem]:
    """Impossible combinations that still load: a fault set to fire after more events
    than the workload's streams can have, or later than the client gives up. They are
    warnings, not errors: the run goes on and the fault is reported as never fired.

    A fault class may add its own by defining `scenario_warnings(self, workload)`
    returning messages (the workload section, or None)."""
    workload = scenario.sections.get("workload")
    max_tokens = getattr(workload, "max_tokens", None)
    timeout = getattr(workload, "timeout", None)
    found: list[Problem] = []
    for index, spec in enumerate(scenario.path):
        where = f"path[{index}] {spec.name}"
        messages: list[str] = []
        if isinstance(max_tokens, int):
            limit = max_tokens + EVENTS_BEYOND_TOKENS
            for name in EVENT_COUNT_FIELDS:
                value = spec.config.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > limit:
                    messages.append(
                        f"{name}: {value} can never be reached: with workload max_tokens "
                        f"{max_tokens} a stream has at most {limit} events"
                    )
        # `after: events|tokens` with `count: N` (faults/cut.py): tokens carry text, so
        # at most max_tokens of them; events add the role, finish, usage and [DONE] frames.
        after = spec.config.get("after", getattr(spec.cls, "after", None))
        count = spec.config.get("count", getattr(spec.cls, "count", None))
        if isinstance(max_tokens, int) and isinstance(count, int) and after in _COUNTS:
            limit = max_tokens + (EVENTS_BEYOND_TOKENS if after == "events" else 0)
            if count > limit:
                messages.append(
                    f"count: cutting after {count} {after} never happens: with workload "
                    f"max_tokens {max_tokens} a stream has at most {limit} {after}"
                )
        when, at = "at", spec.config.get("at")
        if after == "time" and isinstance(spec.config.get("time"), int | float):
            when, at = "time", spec.config["time"]
        if isinstance(timeout, int | float) and isinstance(at, int | float) and at > timeout:
            messages.append(
                f"{when}: {at:g}s is after the workload's timeout ({timeout:g}s): it never fires"
            )
        hook = getattr(spec.cls, "scenario_warnings", None)
        if callable(hook):
            try:
                messages += list(hook(spec.build(), workload))
            except Exception as error:  # a fault's own check must not break loading
                messages.append(f"its scenario_warnings check failed: {error!r}")
        found += [Problem(scenario.source, spec.line or 1, 1, f"{where}: {m}") for m in messages]
    return found


TOP_LEVEL = ("name", "description", "seed", "path", "proxy", "quiet_faults")


def load_scenario_text(
    text: str,
    registry: Mapping[str, type[Fault]],
    *,
    file: str = "<string>",
    sections: Mapping[str, type | None] | None = None,
    presets: Mapping[str, str] | None = None,
) -> Scenario:
    """Parse and validate scenario YAML; raise ScenarioError listing every problem found.

    `sections` names the optional top-level blocks allowed (e.g. `workload`) with the
    dataclass that validates each, or None to keep the block as plain data. `presets`
    maps a preset name to the YAML text of a `path:` list; `- preset: NAME` in a
    scenario's path expands to those faults.
    """
    sections = dict(sections or {})
    problems = _Collector(file)
    if len(text) > MAX_SCENARIO_BYTES:
        raise ScenarioError(
            [Problem(file, 1, 1, f"too large: {len(text)} characters (limit {MAX_SCENARIO_BYTES})")]
        )
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses NUL and control characters
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        detail = " ".join(part for part in (error.context, error.problem) if part)
        raise ScenarioError([Problem(file, line, column, f"YAML syntax error: {detail}")]) from None
    except yaml.YAMLError as error:  # ReaderError: NUL and other control characters
        position = getattr(error, "position", 0) or 0
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        reason = getattr(error, "reason", None) or str(error).splitlines()[0]
        raise ScenarioError(
            [Problem(file, line, column, f"not a YAML text file: {reason}")]
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    convert = _Converter(loader, problems)
    if root is None or not isinstance(root, yaml.MappingNode):
        problems.add(root, "a scenario must be a mapping with at least `name:` and `path:`")
        raise ScenarioError(problems.problems)
    if _expanded_size(root) > MAX_EXPANDED_NODES:
        problems.add(
            root,
            f"more than {MAX_EXPANDED_NODES} values once aliases are expanded "
            "(a YAML alias bomb?); refused",
        )
        raise ScenarioError(problems.problems)

    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    path_node: yaml.Node | None = None
    allowed = [*TOP_LEVEL, *sections]
    for key_node, value_node in convert.mapping_pairs(root, "scenario"):
        key = key_node.value
        try:
            if key == "name":
                values["name"] = convert.convert(value_node, str, "name")
            elif key == "description":
                values["description"] = convert.convert(value_node, str, "description")
            elif key == "seed":
                values["seed"] = convert.convert(value_node, int, "seed")
            elif key == "path":
                path_node = value_node
            elif key == "quiet_faults":
                values["quiet_faults"] = tuple(
                    convert.convert(value_node, list[str], "quiet_faults")
                )
            elif key == "proxy":
                values["proxy"] = convert.dataclass(value_node, ProxyOptions, "proxy")
            elif key in sections:
                schema = sections[key]
                extra[key] = (
                    convert.scalar(value_node)
                    if schema is None
                    else convert.dataclass(value_node, schema, key)
                )
            else:
                problems.add(
                    key_node, f"unknown top-level key {key!r}; valid keys: {', '.join(allowed)}"
                )
        except _Invalid:
            pass
    if "name" not in values:
        values["name"] = Path(file).stem if file != "<string>" else "unnamed"
    specs: tuple[FaultSpec, ...] = ()
    if path_node is not None:
        try:
            specs = _load_path(path_node, registry, convert, presets or {})
        except _Invalid:
            pass
    if problems.problems:
        raise ScenarioError(problems.problems)
    scenario = Scenario(path=specs, sections=extra, source=file, **values)
    return dataclasses.replace(scenario, warnings=tuple(scenario_warnings(scenario)))


def _load_path(
    node: yaml.Node,
    registry: Mapping[str, type[Fault]],
    convert: _Converter,
    presets: Mapping[str, str],
) -> tuple[FaultSpec, ...]:
    problems = convert.problems
    if isinstance(node, yaml.ScalarNode) and convert.scalar(node) is None:
        return ()
    if not isinstance(node, yaml.SequenceNode):
        problems.add(node, "path: expected a list of faults in path order, client side first")
        return ()
    specs: list[FaultSpec] = []
    for index, entry in enumerate(node.value):
        where = f"path[{index}]"
        if isinstance(entry, yaml.ScalarNode):
            name_node, config_node = entry, None
        elif isinstance(entry, yaml.MappingNode) and len(entry.value) == 1:
            name_node, config_node = entry.value[0]
        else:
            problems.add(entry, f"{where}: expected `- fault_name: {{field: value}}`")
            continue
        name = name_node.value
        if name == "preset":
            specs.extend(
                _expand_preset(config_node or name_node, registry, convert, presets, where)
            )
            continue
        cls = registry.get(name)
        if cls is None:
            problems.add(
                name_node,
                f"{where}: unknown fault {name!r}"
                + _did_you_mean(name, registry)
                + f"; valid faults: {', '.join(sorted(registry))}",
            )
            continue
        try:
            config = convert.fields_of(config_node, cls, f"{where} {name}")
            cls(**config)  # run the fault's own checks now, not at the first connection
            specs.append(FaultSpec(cls, config, name_node.start_mark.line + 1))
        except _Invalid:
            pass
        except (TypeError, ValueError) as error:
            problems.add(config_node or name_node, f"{where} {name}: {error}")
    return tuple(specs)


def _expand_preset(
    node: yaml.Node,
    registry: Mapping[str, type[Fault]],
    convert: _Converter,
    presets: Mapping[str, str],
    where: str,
) -> tuple[FaultSpec, ...]:
    """`- preset: nginx-default` becomes the faults that imitate that hop's defaults.

    `- preset: {name: nginx-default, set: {idle_reaper: {timeout: 1s}}}` changes fields
    of the preset's faults (your proxy_read_timeout, say), checked like any fault config.
    """
    overrides: list[tuple[yaml.Node, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        name = ""
        for key_node, value_node in convert.mapping_pairs(node, f"{where} preset"):
            if key_node.value == "name" and isinstance(value_node, yaml.ScalarNode):
                name = str(convert.scalar(value_node))
            elif key_node.value == "set" and isinstance(value_node, yaml.MappingNode):
                overrides = convert.mapping_pairs(value_node, f"{where} preset set")
            else:
                convert.problems.add(
                    key_node,
                    f"{where}: a preset takes `name: PRESET` and `set: {{fault: {{field: "
                    f"value}}}}`, not {key_node.value!r}",
                )
    else:
        name = str(convert.scalar(node)) if isinstance(node, yaml.ScalarNode) else ""
    if name not in presets:
        convert.problems.add(
            node,
            f"{where}: unknown preset {name!r}"
            + _did_you_mean(str(name), presets)
            + f"; valid presets: {', '.join(sorted(presets))}",
        )
        return ()
    loader = yaml.SafeLoader(presets[name])
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    inner = _Converter(loader, convert.problems)
    before = len(convert.problems.problems)
    specs = _load_path(root, registry, inner, presets) if root is not None else ()
    for problem in convert.problems.problems[before:]:  # a preset's own bug, shown at its use
        index = convert.problems.problems.index(problem)
        convert.problems.problems[index] = Problem(
            convert.problems.file,
            node.start_mark.line + 1,
            node.start_mark.column + 1,
            f"{where}: preset {name!r} is invalid: {problem.message}",
        )
    return _override(specs, overrides, convert, f"{where} preset {name!r}")


def _override(
    specs: tuple[FaultSpec, ...],
    overrides: list[tuple[yaml.Node, yaml.Node]],
    convert: _Converter,
    where: str,
) -> tuple[FaultSpec, ...]:
    """Apply a preset's `set:` block: new field values for the faults it names."""
    result = list(specs)
    for fault_node, fields_node in overrides:
        fault = fault_node.value
        positions = [i for i, spec in enumerate(result) if spec.name == fault]
        if not positions:
            convert.problems.add(
                fault_node,
                f"{where} has no {fault!r} fault to set; its faults: "
                + ", ".join(spec.name for spec in specs),
            )
            continue
        for i in positions:
            cls = result[i].cls
            try:
                changed = convert.fields_of(fields_node, cls, f"{where} set {fault}")
                config = {**result[i].config, **changed}
                cls(**config)
                result[i] = dataclasses.replace(result[i], config=config)
            except _Invalid:
                break
            except (TypeError, ValueError) as error:
                convert.problems.add(fields_node, f"{where} set {fault}: {error}")
                break
    return tuple(result)


def _did_you_mean(name: str, registry: Mapping[str, object]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(registry), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_scenario(
    path: str | Path,
    registry: Mapping[str, type[Fault]],
    *,
    sections: Mapping[str, type | None] | None = None,
    presets: Mapping[str, str] | None = None,
) -> Scenario:
    """Load one scenario file; raise ScenarioError naming the file on any problem."""
    file = str(path)
    try:
        size = Path(path).stat().st_size
        if size > MAX_SCENARIO_BYTES:
            raise ScenarioError(
                [Problem(file, 1, 1, f"too large: {size} bytes (limit {MAX_SCENARIO_BYTES})")]
            )
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ScenarioError(
            [Problem(file, 1, 1, f"not a UTF-8 text file (byte {error.start}): {error.reason}")]
        ) from None
    except OSError as error:
        raise ScenarioError([Problem(file, 1, 1, f"cannot read: {error}")]) from None
    return load_scenario_text(text, registry, file=file, sections=sections, presets=presets)


# ----------------------------------------------------------------------------- schema


def json_schema_for_type(tp: Any) -> dict[str, Any]:
    """JSON Schema for one config type, matching what the loader accepts."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        unit = typing.get_args(tp)[1]
        if unit == Unit.SECONDS:
            return {
                "anyOf": [
                    {"type": "number", "minimum": 0},
                    {"type": "string", "pattern": _DURATION.pattern},
                ],
                "description": "duration: seconds, or 250ms / 2s / 1.5min",
            }
        if unit == Unit.BYTES:
            return {
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "pattern": _SIZE.pattern},
                ],
                "description": "size: bytes, or 512B / 4KiB / 1MiB",
            }
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (typing.Union, types.UnionType):
        return {
            "anyOf": [
                {"type": "null"} if arg is type(None) else json_schema_for_type(arg)
                for arg in typing.get_args(tp)
            ]
        }
    if origin in (list, tuple):
        return {"type": "array", "items": json_schema_for_type(typing.get_args(tp)[0])}
    if origin is dict:
        return {
            "type": "object",
            "additionalProperties": json_schema_for_type(typing.get_args(tp)[1]),
        }
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return json_schema_for_dataclass(tp)
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return {"type": simple[tp]} if tp in simple else {}


def json_schema_for_dataclass(cls: type) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name, (f, tp) in config_fields(cls).items():
        prop = json_schema_for_type(tp)
        if f.default is not dataclasses.MISSING and isinstance(f.default, str | int | float | bool):
            prop["default"] = f.default
        properties[name] = prop
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    return schema


def scenario_json_schema(
    registry: Mapping[str, type[Fault]],
    sections: Mapping[str, type | None] | None = None,
    presets: Iterable[str] = (),
) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the scenario format, generated from the registry."""
    preset_name: dict[str, Any] = {"enum": sorted(presets)} if presets else {"type": "string"}
    fault_entries: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {
                "preset": {
                    "anyOf": [
                        preset_name,
                        {
                            "type": "object",
                            "properties": {"name": preset_name, "set": {"type": "object"}},
                            "required": ["name"],
                            "additionalProperties": False,
                        },
                    ]
                }
            },
            "required": ["preset"],
            "additionalProperties": False,
            "description": "a calibrated hop's faults; `set` changes their fields",
        }
    ]
    for name, cls in sorted(registry.items()):
        config = json_schema_for_dataclass(cls)
        fault_entries.append(
            {
                "type": "object",
                "properties": {name: {"anyOf": [config, {"type": "null"}]}},
                "required": [name],
                "additionalProperties": False,
            }
        )
        fault_entries.append({"const": name})
    properties: dict[str, Any] = {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "seed": {"type": "integer"},
        "proxy": json_schema_for_dataclass(ProxyOptions),
        "path": {
            "type": "array",
            "items": {"anyOf": fault_entries},
            "description": "faults in path order, client side first",
        },
    }
    for key, schema in (sections or {}).items():
        properties[key] = json_schema_for_dataclass(schema) if schema else {"type": "object"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "middlebox scenario",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
