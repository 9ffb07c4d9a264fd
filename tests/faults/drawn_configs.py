"""Fault configs drawn from the scenario schema (`middlebox schema`), not hand-listed.

For each fault in the registry, the schema names its fields with their types, units,
choices and defaults; `drawn_entry` draws a `path:` entry from those: each field set
with probability 1/2, a choice from its `enum`, a duration of 1 ms to ~30 s (or 0), a
size of 1 B to 100 KB (or 0), a number or integer up to twice its default, a boolean;
free text, lists and mappings keep their defaults. What the fault itself refuses (its
`__post_init__`: a range, a missing trigger) the loader reports, and another draw is
made: what comes back is a config the scenario loader accepts, in its YAML spelling.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import yaml

from middlebox.compose import json_schema, load_text
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.model import Scenario

DRAWS = 200  # attempts at an accepted config before giving up (none needs more than ~20)


@cache
def fault_fields() -> dict[str, dict[str, Any]]:
    """Each fault's config properties, from the scenario schema's `path:` entries (the
    schema is built once; nobody changes what this returns)."""
    fields: dict[str, dict[str, Any]] = {}
    for entry in json_schema()["properties"]["path"]["items"]["anyOf"]:
        for name, value in entry.get("properties", {}).items():
            if name != "preset":
                fields[name] = value["anyOf"][0]["properties"]
    return fields


def _is_duration(options: list[dict[str, Any]]) -> bool:
    return any(option.get("const") == 0 for option in options)


def _is_size(options: list[dict[str, Any]]) -> bool:
    return any(option.get("type") == "integer" for option in options) and any(
        option.get("type") == "string" for option in options
    )


def draw_value(rng: random.Random, prop: dict[str, Any]) -> tuple[bool, Any]:
    """(whether to set it, a value) for one schema property."""
    if "enum" in prop:
        return True, rng.choice(prop["enum"])
    options = prop.get("anyOf")
    if options is not None:
        if any(option.get("type") == "null" for option in options) and rng.random() < 0.2:
            return True, None
        rest = [option for option in options if option.get("type") != "null"]
        if _is_duration(rest):
            return True, 0 if rng.random() < 0.1 else f"{round(10 ** rng.uniform(0, 4.5))}ms"
        if _is_size(rest):
            return True, 0 if rng.random() < 0.1 else round(10 ** rng.uniform(0, 5))
        return draw_value(rng, rest[0]) if len(rest) == 1 else (False, None)
    kind = prop.get("type")
    default = prop.get("default")
    if kind == "boolean":
        return True, rng.random() < 0.5
    if kind == "integer":
        top = max(2 * default, 10) if isinstance(default, int) else 10
        return True, rng.randint(0, top)
    if kind == "number":
        top = max(2.0 * default, 1.0) if isinstance(default, int | float) else 1.0
        return True, round(rng.uniform(0.0, top), 3)
    return False, None  # free text, lists, mappings (`match`, `headers`): the default


def drawn_entry(
    name: str, rng: random.Random, fixed: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A `path:` entry for fault `name` with drawn fields (`fixed` ones as given) that
    the loader accepts."""
    props = fault_fields()[name]
    for _ in range(DRAWS):
        config: dict[str, Any] = {}
        for field, prop in props.items():
            if fixed and field in fixed:
                config[field] = fixed[field]
                continue
            if rng.random() < 0.5:
                wanted, value = draw_value(rng, prop)
                if wanted:
                    config[field] = value
        entry = {name: config}
        try:
            scenario_of([entry])
        except ScenarioError:
            continue
        return entry
    raise AssertionError(f"no accepted config for {name} in {DRAWS} draws")


def scenario_of(entries: list[dict[str, Any]], seed: int = 0) -> Scenario:
    """A scenario whose `path:` is `entries`, through the loader (units, checks)."""
    text = yaml.safe_dump({"name": "drawn", "seed": seed, "path": entries}, sort_keys=False)
    return load_text(text)
