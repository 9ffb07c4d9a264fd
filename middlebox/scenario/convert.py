"""The YAML-to-dataclass converter: nodes in, checked values out, problems with marks.

PyYAML's SafeLoader gives nodes that keep their marks, so every problem names the file,
line and column, the bad key or value, and what was expected. Types come from the
dataclass annotations themselves: `Seconds` and `Bytes` (middlebox.core.fault) accept the
units of `units.py`, `Literal[...]` lists its choices, unions try each arm, nested
dataclasses are mappings whose keys are checked. Nothing here knows what a scenario is.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from middlebox.core.fault import Unit
from middlebox.scenario.units import parse_duration, parse_size


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


class ProblemCollector:
    """Problems found so far in one file, each placed at its node's mark."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []

    def add(self, node: yaml.Node | None, message: str) -> None:
        mark = node.start_mark if node is not None else None
        line = mark.line + 1 if mark is not None else 1
        column = mark.column + 1 if mark is not None else 1
        self.problems.append(Problem(self.file, line, column, message))


class Invalid(Exception):
    """A value could not be converted; the caller records it and goes on."""


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


class Converter:
    """Converts one document's nodes, recording each problem at its node and going on."""

    def __init__(self, loader: yaml.SafeLoader, problems: ProblemCollector) -> None:
        self.loader = loader
        self.problems = problems

    def scalar(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as error:
            # SafeLoader refuses !!python/* and unknown tags: a clear problem, never code.
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            self.problems.add(node, f"unsupported YAML value: {problem}")
            raise Invalid from None

    def convert(self, node: yaml.Node, tp: Any, what: str) -> Any:
        """Convert `node` to `tp`, recording a problem (and raising Invalid) if it won't go."""
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
                except Invalid:
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
            except Invalid:
                bad = True
        if bad:
            raise Invalid
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
        raise Invalid


def did_you_mean(name: str, registry: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(name, list(registry), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
