"""Loading scenario files: YAML text in, a validated `Scenario` out, or every problem.

Files are parsed with PyYAML's SafeLoader (no code execution) into nodes that keep their
marks, so every error names the file, line and column. Keys are checked against the
top-level names, the registry (with did-you-mean; `quiet_faults` against the path too), the
`expect:` metric names and conditions (`expect.py`) and the optional sections the caller
allows; duplicate keys are errors, not silently last-one-wins as in plain PyYAML. The
registry and presets are passed in (the composition root owns faults/).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from middlebox.core.fault import Fault
from middlebox.scenario.convert import (
    Converter,
    Invalid,
    Problem,
    ProblemCollector,
    ScenarioError,
    did_you_mean,
)
from middlebox.scenario.expect import EXPECT_CLIENTS, check_expect
from middlebox.scenario.model import FaultSpec, Scenario, scenario_warnings
from middlebox.scenario.presets import expand_preset, scenario_proxy

# A scenario is a page of YAML; anything this big is a mistake (or an attack), refused
# before parsing so a stray multi-gigabyte file cannot exhaust memory.
MAX_SCENARIO_BYTES = 1024 * 1024
# Nodes, and characters of scalars, after expanding aliases: a "billion laughs" document is
# tiny but expands exponentially when walked as a tree, as the converters (and the control
# API's answer) do. Strings count too: 30 aliases of 30 aliases of a 60 KB string are only
# 960 nodes, but 54 MB of values. Expanded, a scenario may hold no more than a file may.
MAX_EXPANDED_NODES = 100_000
MAX_EXPANDED_CHARS = MAX_SCENARIO_BYTES


TOP_LEVEL = ("name", "description", "seed", "path", "proxy", "quiet_faults")

EXPECT_HINTS = "expect_hints"
"""The `sections` key holding the `hint:` texts of `expect:` rules, by metric name (and
`CLIENT/metric` for a client's own block): why a check matters and what fixes it, shown
next to a failed check by the scorecard, junit.xml and report.html."""


def split_hints(
    expect: Any, node: yaml.Node, problems: ProblemCollector
) -> tuple[Any, dict[str, str]]:
    """`expect:` without its `hint:` entries, and the hints by metric (`CLIENT/metric` in a
    client's block). A rule keeps its conditions: `{equals: 0, hint: "..."}` checks equals."""
    hints: dict[str, str] = {}
    if not isinstance(expect, dict):
        return expect, hints

    def strip(rules: dict[str, Any], prefix: str) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for name, rule in rules.items():
            if isinstance(rule, dict) and "hint" in rule:
                hint = rule["hint"]
                if not isinstance(hint, str) or not hint.strip():
                    problems.add(node, f"expect: {prefix}{name}: hint must be a non-empty string")
                else:
                    hints[f"{prefix}{name}"] = " ".join(hint.split())
                rule = {k: v for k, v in rule.items() if k != "hint"}
                if not rule:
                    problems.add(
                        node,
                        f"expect: {prefix}{name}: a hint needs a condition beside it "
                        "(equals, max, min, ...)",
                    )
            # a client's own block ({raw: {client.x: ...}}) holds rules, not conditions
            elif isinstance(rule, dict) and any("." in str(k) for k in rule):
                rule = strip(rule, f"{name}/")
            kept[name] = rule
        return kept

    return strip(expect, ""), hints


# Deeper nesting than any scenario needs: PyYAML composes nodes recursively, so 5000
# nested `[` would end in a RecursionError traceback instead of a located problem.
MAX_NESTING = 64
# A number written with more digits than this is refused where it stands (Python refuses
# int() of 4300+ digits with a ValueError; no setting needs more than a few dozen).
MAX_NUMBER_DIGITS = 100
_NUMBER = re.compile(r"[-+]?[0-9_.]+(?:[eE][-+]?[0-9]+)?")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader refusing, where it stands, what no scenario needs: nesting deeper
    than MAX_NESTING (its composer recurses, so 5000 `[` would end in a RecursionError),
    numbers longer than MAX_NUMBER_DIGITS, and values that aliases expand past
    MAX_EXPANDED_NODES nodes or MAX_EXPANDED_CHARS characters. All of it is counted while
    the document is composed, in one pass that stops at the first limit crossed: the
    pure-Python parser costs ~15 us a value, so a second pass, or one to the end of a
    refused 700 KB list, is seconds."""

    def __init__(self, text: str, file: str) -> None:
        super().__init__(text)
        self.file = file
        self.depth = 0
        self.nodes = 0
        self.chars = 0
        # An anchored node's expanded size (nodes, characters), added at each of its aliases.
        self.expanded: dict[int, tuple[int, int]] = {}

    def refuse(self, mark: Any, message: str) -> ScenarioError:
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        return ScenarioError([Problem(self.file, line, column, message)])

    def count(self, nodes: int, chars: int, mark: Any) -> None:
        self.nodes += nodes
        self.chars += chars
        if self.nodes > MAX_EXPANDED_NODES:
            raise self.refuse(
                mark,
                f"more than {MAX_EXPANDED_NODES} values once aliases are expanded "
                "(a YAML alias bomb?); refused",
            )
        if self.chars > MAX_EXPANDED_CHARS:
            raise self.refuse(
                mark,
                f"more than {MAX_EXPANDED_CHARS} characters of values once aliases are "
                "expanded (a YAML alias bomb?); refused",
            )

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            node = self.anchors.get(event.anchor)
            if node is not None:  # an alias inside its own anchor counts once, not forever
                self.count(*self.expanded.get(id(node), (1, 0)), event.start_mark)
            return super().compose_node(parent, index)
        before = (self.nodes, self.chars)
        collection = isinstance(event, yaml.CollectionStartEvent)
        if collection:
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.refuse(event.start_mark, f"nested more than {MAX_NESTING} deep; refused")
            self.count(1, 0, event.start_mark)
        elif isinstance(event, yaml.ScalarEvent):
            value = event.value
            if event.style is None and len(value) > MAX_NUMBER_DIGITS and _NUMBER.fullmatch(value):
                raise self.refuse(
                    event.start_mark,
                    f"a number of {len(value)} characters (limit {MAX_NUMBER_DIGITS}); refused",
                )
            self.count(1, len(value), event.start_mark)
        node = super().compose_node(parent, index)
        if collection:
            self.depth -= 1
        if event.anchor is not None:
            self.expanded[id(node)] = (self.nodes - before[0], self.chars - before[1])
        return node


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
    problems = ProblemCollector(file)
    if len(text) > MAX_SCENARIO_BYTES:
        raise ScenarioError(
            [Problem(file, 1, 1, f"too large: {len(text)} characters (limit {MAX_SCENARIO_BYTES})")]
        )
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text, file)  # its reader refuses NUL and control characters
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
    convert = Converter(loader, problems)
    if root is None or not isinstance(root, yaml.MappingNode):
        problems.add(root, "a scenario must be a mapping with at least `name:` and `path:`")
        raise ScenarioError(problems.problems)
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    path_node: yaml.Node | None = None
    proxy_node: yaml.Node | None = None
    quiet_node: yaml.Node | None = None
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
                quiet_node = value_node  # checked against the path, below
            elif key == "proxy":
                proxy_node = value_node  # read with the path's presets, below
            elif key in sections:
                schema = sections[key]
                extra[key] = (
                    convert.scalar(value_node)
                    if schema is None
                    else convert.dataclass(value_node, schema, key)
                )
                if key == "expect":
                    extra[EXPECT_CLIENTS] = check_expect(value_node, convert)
                    extra[key], extra[EXPECT_HINTS] = split_hints(extra[key], value_node, problems)
                extra[key] = resolve_paths(extra[key], key, value_node, file, problems)
            else:
                problems.add(
                    key_node, f"unknown top-level key {key!r}; valid keys: {', '.join(allowed)}"
                )
        except Invalid:
            pass
    if "name" not in values:
        values["name"] = Path(file).stem if file != "<string>" else "unnamed"
    specs: tuple[FaultSpec, ...] = ()
    path_problems = len(problems.problems)
    if path_node is not None:
        try:
            specs = load_path(path_node, registry, convert, presets or {})
        except Invalid:
            pass
    if quiet_node is not None:
        whole_path = specs if len(problems.problems) == path_problems else None
        try:
            values["quiet_faults"] = load_quiet_faults(quiet_node, registry, whole_path, convert)
        except Invalid:
            pass
    try:  # a preset's `proxy:` fields, under the scenario's own (scenario/presets.py)
        values["proxy"] = scenario_proxy(proxy_node, path_node, convert, presets or {})
    except Invalid:
        pass
    if problems.problems:
        raise ScenarioError(problems.problems)
    scenario = Scenario(path=specs, sections=extra, source=file, **values)
    return dataclasses.replace(scenario, warnings=tuple(scenario_warnings(scenario)))


PATH_FIELDS = ("cassette",)
"""Fields of a scenario's sections that name a file: relative to the scenario file."""


def resolve_paths(
    value: Any, section: str, node: yaml.Node, file: str, problems: ProblemCollector
) -> Any:
    """A section with its file fields made absolute against the scenario file's folder (so
    `cassette: tapes/x.json` means the same from any current directory), each checked to
    exist now: a missing file is a scenario problem here, not a failure in the upstream's
    log later. A scenario from a string (`<string>`, the control API) keeps its paths."""
    for name in PATH_FIELDS:
        written = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
        if not isinstance(written, str) or not written:
            continue
        path = Path(written).expanduser()
        if not path.is_absolute() and not file.startswith("<"):
            path = Path(file).resolve().parent / path
        if not path.is_file():
            problems.add(
                _field_node(node, name),
                f"{section}: {name}: no such file: {path} (paths in a scenario are "
                "relative to the scenario file)",
            )
            continue
        if isinstance(value, dict):
            value = {**value, name: str(path)}
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.replace(value, **{name: str(path)})
    return value


def _field_node(node: yaml.Node, name: str) -> yaml.Node:
    """The value node of `name` inside a mapping node (for its line), or the mapping."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if getattr(key, "value", None) == name:
                return value  # type: ignore[no-any-return]
    return node


def load_path(
    node: yaml.Node,
    registry: Mapping[str, type[Fault]],
    convert: Converter,
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
            preset_node = config_node or name_node
            specs.extend(expand_preset(preset_node, registry, convert, presets, where, load_path))
            continue
        cls = registry.get(name)
        if cls is None:
            problems.add(name_node, unknown_fault(name, registry, where))
            continue
        try:
            config = convert.fields_of(config_node, cls, f"{where} {name}")
            cls(**config)  # run the fault's own checks now, not at the first connection
            specs.append(FaultSpec(cls, config, name_node.start_mark.line + 1))
        except Invalid:
            pass
        except (TypeError, ValueError) as error:
            problems.add(config_node or name_node, f"{where} {name}: {error}")
    return tuple(specs)


def unknown_fault(name: str, registry: Mapping[str, type[Fault]], where: str) -> str:
    return (
        f"{where}: unknown fault {name!r}"
        + did_you_mean(name, registry)
        + f"; valid faults: {', '.join(sorted(registry))}"
    )


def load_quiet_faults(
    node: yaml.Node,
    registry: Mapping[str, type[Fault]],
    path: tuple[FaultSpec, ...] | None,
    convert: Converter,
) -> tuple[str, ...]:
    """`quiet_faults:`, faults of the path that must not fire. A name that is no fault, or
    a fault the path does not hold (`path` None: the path has problems of its own, so what
    it holds is unknown), is a problem: a fault outside the path can never fire, and a run
    would call the fix it stands for proven while it proved nothing."""
    names = tuple(convert.convert(node, list[str], "quiet_faults"))
    declared = [] if path is None else list(dict.fromkeys(spec.name for spec in path))
    for index, (name, item) in enumerate(zip(names, node.value, strict=True)):
        where = f"quiet_faults[{index}]"
        if name not in registry:
            convert.problems.add(item, unknown_fault(name, registry, where))
        elif path is not None and name not in declared:
            convert.problems.add(
                item,
                f"{where}: {name!r} is not in this scenario's path, so it can never fire and "
                "listing it proves nothing; quiet_faults names faults of the path "
                f"({', '.join(declared) or 'the path is empty'})",
            )
    return names


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
