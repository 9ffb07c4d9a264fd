"""The JSON Schema (draft 2020-12) of the scenario format, generated from the registry.

Editors use it for completion and checking; it accepts what `load.py` accepts (durations
with their unit as `units.py` parses them, sizes as bytes or with a unit, Literal choices as
enums, presets and fault names by name). The committed copy is `schema/scenario.schema.json`
(kept current by a test); `middlebox schema > scenario.schema.json` writes it beside a
project's scenarios, and a scenario file points an editor at it with a first line

    # yaml-language-server: $schema=scenario.schema.json

A typo in a fault name is reported against the list of fault names (`propertyNames`), not
only as "matches none of the entries".
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from middlebox.core.fault import Fault, Unit
from middlebox.scenario.convert import config_fields
from middlebox.scenario.expect import CONDITIONS
from middlebox.scenario.model import ProxyOptions
from middlebox.scenario.units import DURATION_PATTERN, SIZE_PATTERN, format_duration

SCHEMA_ID = "urn:middlebox:scenario:1"
"""The schema's `$id`: a name, not a download address (editors are pointed at the
committed file); the number changes when a valid scenario stops being valid."""


def json_schema_for_type(tp: Any) -> dict[str, Any]:
    """JSON Schema for one config type, matching what the loader accepts."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        unit = typing.get_args(tp)[1]
        if unit == Unit.SECONDS:
            return {
                "anyOf": [
                    {"const": 0},
                    {"type": "string", "pattern": DURATION_PATTERN.pattern},
                ],
                "description": "duration with its unit: 250ms, 2s, 1.5min (units us, ms, "
                "s, min, h); a bare number other than 0 is an error: write 300ms or 300s",
            }
        if unit == Unit.BYTES:
            return {
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "pattern": SIZE_PATTERN.pattern},
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
            default = f.default
            is_duration = (
                typing.get_origin(tp) is typing.Annotated and typing.get_args(tp)[1] == Unit.SECONDS
            )
            if is_duration and isinstance(default, int | float) and not isinstance(default, bool):
                default = format_duration(float(default))  # as a scenario must write it
            prop["default"] = default
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
    properties["quiet_faults"] = {
        "type": "array",
        "items": {"enum": sorted(registry)},
        "uniqueItems": True,
        "description": "faults of the path expected NOT to fire (a fix keeps them quiet); "
        "the run fails if one fires, and no 'never fired' warning is given for them",
    }
    names = [*sorted(registry), "preset"]
    path = properties["path"]["items"]
    # Where an entry is a mapping, its one key must be a fault (or preset) name: a typo is
    # then one error against the names instead of a failure under each of the entries.
    path.update(
        {
            "if": {"type": "object"},
            "then": {"propertyNames": {"enum": names}, "minProperties": 1, "maxProperties": 1},
            "else": {"enum": sorted(registry)},
        }
    )
    for key, schema in (sections or {}).items():
        if key == "expect" and schema is None:
            properties[key] = expect_schema()
        else:
            properties[key] = json_schema_for_dataclass(schema) if schema else {"type": "object"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "middlebox scenario",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }


def expect_schema() -> dict[str, Any]:
    """`expect:`: metric -> a value (equals) or conditions with an optional `hint:`; a
    client's name -> its own block of the same."""
    value: dict[str, Any] = {"type": ["number", "boolean"]}
    conditions: dict[str, Any] = {
        "type": "object",
        "properties": {
            **{condition: {"type": ["number", "boolean"]} for condition in CONDITIONS},
            "hint": {
                "type": "string",
                "minLength": 1,
                "description": "why this check matters and what fixes it when it fails "
                "(shown beside the failed check)",
            },
        },
        "additionalProperties": False,
    }
    rule = {"anyOf": [value, conditions]}
    return {
        "type": "object",
        "description": "checks on the run's metrics (docs/scenarios.md): `metric: value`, "
        "`metric: {max: N, hint: ...}`, or `CLIENT: {metric: ...}` for one client",
        "additionalProperties": {
            "anyOf": [
                rule,
                # a client's block holds metrics (`client.x`, `server.y`), never conditions
                {
                    "type": "object",
                    "propertyNames": {"pattern": "\\."},
                    "additionalProperties": rule,
                },
            ],
        },
    }
