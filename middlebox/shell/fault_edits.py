"""One fault at a time on a live proxy: the path's faults written back as a scenario would
write them, and the edits the control API's `/faults` routes make.

A converted fault config holds seconds as floats and sizes as ints; a scenario must write a
duration with its unit (`300ms`, never a bare 0.3). `written_options` turns a `FaultSpec`
back into the options a scenario would write (only those that differ from the fault's
defaults, durations with their unit), so `GET /faults` shows what can be sent back, and
`PATCH /faults/N` merges a change into the fault's own options and validates the result
with the same loader as `PUT /scenario`. Edits are plain functions of the path (no sockets,
no event loop): the control API applies their result to the proxy.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from middlebox.core.fault import Unit
from middlebox.scenario.convert import Problem, ScenarioError
from middlebox.scenario.model import FaultSpec, Scenario
from middlebox.scenario.units import format_duration


class EditError(ValueError):
    """A fault edit the control API refuses (its status and the JSON it answers)."""

    def __init__(self, status: int, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.problems = list(problems)

    def body(self) -> dict[str, Any]:
        return {"error": str(self), **({"problems": self.problems} if self.problems else {})}


# ------------------------------------------------------------- written options


def written_options(spec: FaultSpec) -> dict[str, Any]:
    """The options a scenario writes for `spec` (its config holds those it was given),
    durations with their unit, nested blocks as mappings."""
    return _written_fields(spec.cls, spec.config, skip_defaults=False)


def written_block(value: Any) -> dict[str, Any]:
    """A config dataclass instance (the `proxy:` block, a fault's `match:`) as a scenario
    writes it: the fields that differ from their defaults."""
    fields = {f.name: getattr(value, f.name) for f in _fields(value)}
    return _written_fields(type(value), fields, skip_defaults=True)


def _fields(value: Any) -> tuple[dataclasses.Field[Any], ...]:
    return tuple(f for f in dataclasses.fields(value) if f.init)


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _written_fields(cls: type, config: Mapping[str, Any], *, skip_defaults: bool) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    written: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init or field.name not in config:
            continue
        value = config[field.name]
        if skip_defaults and value == _default(field):
            continue
        written[field.name] = _written(value, hints.get(field.name, Any))
    return written


def _unit(hint: Any) -> str | None:
    """The unit an annotation carries (`Seconds`, `Bytes`), looking inside unions."""
    if typing.get_origin(hint) is typing.Annotated:
        return next((arg for arg in hint.__metadata__ if isinstance(arg, str)), None)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        units = {_unit(arm) for arm in typing.get_args(hint)} - {None}
        return units.pop() if len(units) == 1 else None
    return None


def _element(hint: Any, position: int = 0) -> Any:
    """The element annotation of a list/tuple/dict hint (inside an Optional too)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        arms = [arm for arm in typing.get_args(hint) if arm is not type(None)]
        hint = arms[0] if len(arms) == 1 else Any
    args = typing.get_args(hint)
    if not args:
        return Any
    return args[min(position, len(args) - 1)] if args[-1] is not Ellipsis else args[0]


def _written(value: Any, hint: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float) and _unit(hint) == Unit.SECONDS:
        return format_duration(float(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return written_block(value)
    if isinstance(value, Mapping):
        return {str(k): _written(v, _element(hint, 1)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_written(v, _element(hint, i)) for i, v in enumerate(value)]
    if isinstance(value, str | int | float):
        return value
    return repr(value)


def listing(scenario: Scenario) -> list[dict[str, Any]]:
    """`GET /faults`: each fault of the active path with its index and written options."""
    return [
        {"index": index, "fault": spec.name, "options": written_options(spec)}
        for index, spec in enumerate(scenario.path)
    ]


def scenario_document(scenario: Scenario) -> dict[str, Any]:
    """The active scenario as a document `PUT /scenario` takes back (the live parts: name,
    description, seed, the proxy block and the path)."""
    document: dict[str, Any] = {"name": scenario.name}
    if scenario.description:
        document["description"] = scenario.description
    document["seed"] = scenario.seed
    proxy = written_block(scenario.proxy)
    if proxy:
        document["proxy"] = proxy
    document["path"] = [{spec.name: written_options(spec)} for spec in scenario.path]
    return document


# ------------------------------------------------------------------- the edits


def entry_of(body: Any) -> tuple[dict[str, Any], int | None]:
    """A `POST /faults` body as a path entry and the position asked: `{"fault": NAME,
    "options": {...}, "at": N}` or a scenario's own entry form `{NAME: {...}}` (a
    `{"preset": NAME}` entry too)."""
    if not isinstance(body, dict) or not body:
        raise EditError(400, 'expected {"fault": NAME, "options": {...}} or {NAME: {...}}')
    body = dict(body)
    at = body.pop("at", None)
    if at is not None and (isinstance(at, bool) or not isinstance(at, int)):
        raise EditError(400, f"at: expected a position (an integer), got {at!r}")
    if "fault" in body:
        name, options = body.pop("fault"), body.pop("options", None) or {}
        if body:
            raise EditError(400, f"unknown keys {sorted(body)}; use fault, options and at")
        if not isinstance(name, str) or not isinstance(options, dict):
            raise EditError(400, "fault: a fault's name; options: a mapping of its options")
        return {name: options}, at
    if len(body) != 1:
        raise EditError(400, f"one fault per request: got {sorted(body)}")
    return body, at


def loaded_entries(
    entries: list[dict[str, Any]], load_text: typing.Callable[[str, str], Scenario], what: str
) -> tuple[FaultSpec, ...]:
    """The faults of `entries`, validated by the scenario loader (every problem at once)."""
    document = json.dumps({"name": what, "path": entries}, indent=1)
    try:
        return load_text(document, what).path
    except ScenarioError as error:
        raise EditError(400, "invalid fault", [_problem_text(p) for p in error.problems]) from None


def _problem_text(problem: Problem) -> str:
    # The document was written here from the request, so its line numbers and path
    # position point nowhere the sender can look: the message names the fault and option.
    return _GENERATED_POSITION.sub("", problem.message, count=1)


_GENERATED_POSITION = re.compile(r"^path\[\d+\]:? ?")


def position(scenario: Scenario, reference: str) -> int:
    """The index `/faults/{reference}` names: a number, or a fault name used once."""
    count = len(scenario.path)
    if reference.lstrip("-").isdigit():
        index = int(reference)
        if not -count <= index < count:
            raise EditError(404, f"no fault at index {index}: the path has {count} faults")
        return index % count
    found = [i for i, spec in enumerate(scenario.path) if spec.name == reference]
    if not found:
        names = ", ".join(spec.name for spec in scenario.path) or "none"
        raise EditError(404, f"no fault named {reference!r} in the path (faults: {names})")
    if len(found) > 1:
        raise EditError(
            409, f"{len(found)} faults are named {reference!r} (at {found}): name one by index"
        )
    return found[0]


@dataclasses.dataclass(frozen=True)
class Edit:
    """A new path and, per fault, whether it keeps its cross-connection state (the index
    of its old position) or starts fresh (None)."""

    path: tuple[FaultSpec, ...]
    kept: tuple[int | None, ...]
    touched: tuple[int, ...]


def inserted(scenario: Scenario, specs: Sequence[FaultSpec], at: int | None) -> Edit:
    count = len(scenario.path)
    where = count if at is None else at
    if not -count <= where <= count:
        raise EditError(400, f"at: {at} is outside the path (0 to {count})")
    where = where % (count + 1) if where < 0 else where
    old = list(range(count))
    return Edit(
        (*scenario.path[:where], *specs, *scenario.path[where:]),
        (*old[:where], *([None] * len(specs)), *old[where:]),
        tuple(range(where, where + len(specs))),
    )


def changed(
    scenario: Scenario,
    index: int,
    change: Any,
    load_text: typing.Callable[[str, str], Scenario],
) -> Edit:
    """The fault at `index` with `change` merged into its written options (a `null`
    option goes back to its default), validated as a whole."""
    if not isinstance(change, dict):
        raise EditError(400, "expected a mapping of the options to change")
    if "options" in change and len(change) == 1 and isinstance(change["options"], dict):
        change = change["options"]
    spec = scenario.path[index]
    options = {**written_options(spec), **change}
    options = {name: value for name, value in options.items() if value is not None}
    (new,) = loaded_entries([{spec.name: options}], load_text, f"<PATCH /faults/{index}>")
    path = list(scenario.path)
    path[index] = new
    kept = tuple(None if i == index else i for i in range(len(path)))
    return Edit(tuple(path), kept, (index,))


def removed(scenario: Scenario, index: int) -> Edit:
    indices = [i for i in range(len(scenario.path)) if i != index]
    return Edit(tuple(scenario.path[i] for i in indices), tuple(indices), (index,))
