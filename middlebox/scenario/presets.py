"""Presets in a scenario's path: `- preset: NAME` expands to a calibrated hop's faults.

A preset is the YAML text of a `path:` list (faults/presets.py holds the library's,
passed in by the composition root). `set:` changes fields of the preset's faults, checked
like any fault config; a preset's own bug is reported at the line that uses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import yaml

from middlebox.core.fault import Fault
from middlebox.scenario.convert import Converter, Invalid, Problem, did_you_mean
from middlebox.scenario.model import FaultSpec

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
    loader = yaml.SafeLoader(presets[name])
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
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
