"""The JSON Schema (draft 2020-12) of the scenario format, generated from the registry.

Editors use it for completion and checking; it accepts what `load.py` accepts (units as
numbers or the patterns of `units.py`, Literal choices as enums, presets by name).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from middlebox.core.fault import Fault, Unit
from middlebox.scenario.convert import config_fields
from middlebox.scenario.model import ProxyOptions
from middlebox.scenario.units import DURATION_PATTERN, SIZE_PATTERN


def json_schema_for_type(tp: Any) -> dict[str, Any]:
    """JSON Schema for one config type, matching what the loader accepts."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        unit = typing.get_args(tp)[1]
        if unit == Unit.SECONDS:
            return {
                "anyOf": [
                    {"type": "number", "minimum": 0},
                    {"type": "string", "pattern": DURATION_PATTERN.pattern},
                ],
                "description": "duration: seconds, or 250ms / 2s / 1.5min",
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
