"""Presets in a scenario's path: `- preset: NAME` expands to a calibrated hop's faults.

A preset is the YAML text of a `path:` list, or of a mapping with that list as `path:` and
a `proxy:` block (faults/presets.py holds the library's, passed in by the composition
root). `set:` changes fields of the preset's faults, checked like any fault config; a
preset's own bug is reported at the line that uses it.

A preset's `proxy:` block is the hop's own behaviour that is not a fault (nginx's client
timers: `keepalive_timeout`, `client_body_timeout`). The presets a scenario uses lend their
`proxy:` fields to the scenario's `proxy:` options, in path order; a field the scenario
writes in its own `proxy:` block wins (`scenario_proxy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from middlebox.core.fault import Fault
from middlebox.scenario.convert import Converter, Invalid, Problem, did_you_mean
from middlebox.scenario.model import FaultSpec, ProxyOptions

PathLoader = Callable[
    [yaml.Node, Mapping[str, type[Fault]], Converter, Mapping[str, str]], tuple[FaultSpec, ...]
]
"""`load.load_path`, passed in so a preset's path loads like the scenario's own."""


def expand_preset(
    node: yaml.Node,
    registry: Mapping[str, type[Fault]],
    convert: Converter,
    presets: Mapping[str, str],
    where: str,
    load_path: PathLoader,
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
            + did_you_mean(str(name), presets)
            + f"; valid presets: {', '.join(sorted(presets))}",
        )
        return ()
    loader, root, _ = preset_document(presets[name])
    inner = Converter(loader, convert.problems)
    before = len(convert.problems.problems)
    specs = load_path(root, registry, inner, presets) if root is not None else ()
    for problem in convert.problems.problems[before:]:  # a preset's own bug, shown at its use
        index = convert.problems.problems.index(problem)
        convert.problems.problems[index] = Problem(
            convert.problems.file,
            node.start_mark.line + 1,
            node.start_mark.column + 1,
            f"{where}: preset {name!r} is invalid: {problem.message}",
        )
    return apply_overrides(specs, overrides, convert, f"{where} preset {name!r}")


def preset_document(text: str) -> tuple[yaml.SafeLoader, yaml.Node | None, yaml.Node | None]:
    """A preset's text as its loader, its path node and its `proxy:` node (or None)."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    if not isinstance(root, yaml.MappingNode):
        return loader, root, None  # the plain form: the text is the path list
    parts = {key.value: value for key, value in root.value if isinstance(key, yaml.ScalarNode)}
    return loader, parts.get("path"), parts.get("proxy")


def preset_text(path: str, proxy: str | None = None) -> str:
    """The text of a preset with the path list `path` and the `proxy:` mapping `proxy`."""
    if proxy is None:
        return path
    return yaml.safe_dump({"path": yaml.safe_load(path) or [], "proxy": yaml.safe_load(proxy)})


def _preset_name(entry: yaml.Node) -> tuple[str, yaml.Node] | None:
    """The preset a path entry uses (`- preset: NAME` or `- preset: {name: NAME}`)."""
    if not (isinstance(entry, yaml.MappingNode) and len(entry.value) == 1):
        return None
    key, value = entry.value[0]
    if getattr(key, "value", None) != "preset":
        return None
    if isinstance(value, yaml.ScalarNode):
        return str(value.value), value
    if isinstance(value, yaml.MappingNode):
        for field_key, field_value in value.value:
            if getattr(field_key, "value", None) == "name":
                return str(field_value.value), value
    return None


def preset_proxy_fields(
    path_node: yaml.Node | None,
    convert: Converter,
    presets: Mapping[str, str],
    seen: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The `proxy:` fields the presets in a path lend, in path order (a later one wins);
    presets inside presets included. Unknown presets are `expand_preset`'s to report."""
    fields: dict[str, Any] = {}
    if not isinstance(path_node, yaml.SequenceNode):
        return fields
    for entry in path_node.value:
        used = _preset_name(entry)
        if used is None or used[0] not in presets or used[0] in seen:
            continue
        name, node = used
        loader, root, proxy = preset_document(presets[name])
        inner = Converter(loader, convert.problems)
        fields.update(preset_proxy_fields(root, inner, presets, seen | {name}))
        if proxy is None:
            continue
        try:
            fields.update(inner.fields_of(proxy, ProxyOptions, f"preset {name!r} proxy"))
        except Invalid:
            convert.problems.add(node, f"preset {name!r} has an invalid proxy: block")
    return fields


def scenario_proxy(
    proxy_node: yaml.Node | None,
    path_node: yaml.Node | None,
    convert: Converter,
    presets: Mapping[str, str],
) -> ProxyOptions:
    """The scenario's `proxy:` options: its presets' fields, then its own (which win)."""
    fields = preset_proxy_fields(path_node, convert, presets)
    fields.update(convert.fields_of(proxy_node, ProxyOptions, "proxy"))
    try:
        return ProxyOptions(**fields)
    except (TypeError, ValueError) as error:
        convert.problems.add(proxy_node or path_node, f"proxy: {error}")
        raise Invalid from None


def apply_overrides(
    specs: tuple[FaultSpec, ...],
    overrides: list[tuple[yaml.Node, yaml.Node]],
    convert: Converter,
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
            except Invalid:
                break
            except (TypeError, ValueError) as error:
                convert.problems.add(fields_node, f"{where} set {fault}: {error}")
                break
    return tuple(result)
