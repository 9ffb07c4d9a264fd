"""The result file of the client contract (`middlebox.clients`, docs/clients.md "Result"),
checked where the runner reads it.

A user's own client (`--client-cmd`) writes this file by hand, so anything can be in it. The
scorer reads what the contract promises, so a file that breaks it is refused here, once, with
one line naming the first thing wrong (`results[0].index: expected an integer, got "zero"`),
and the run says that instead of scoring. `index` is the one field every entry must have: the
README's example client leaves out the optional ones, which the scorer reads as absent.

Pure (json only): the runner imports it without the asyncio of the built-in clients.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

SHOWN_VALUE = 40
"""Characters of a wrong value quoted in the message."""


class ResultError(ValueError):
    """The result file breaks the contract; the message says where and how."""


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _piece(value: Any) -> bool:
    """`[display_time, text_piece]`: what `chunks` and `reasoning` hold."""
    return isinstance(value, list) and len(value) == 2 and _number(value[0]) and _string(value[1])


# Per field of a result entry: what its value must be, and how the message names that. A
# list field names its items, and each item is checked on its own.
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "index": (_integer, "an integer"),
    "text": (_string, "a string"),
    "finish_reason": (_or_null(_string), "a string or null"),
    "error": (_or_null(_string), "a string or null"),
    "usage": (_or_null(_object), "an object or null"),
    "started_at": (_number, "a number (time.time())"),
    "ended_at": (_number, "a number (time.time())"),
    "attempts": (_or_null(_integer), "an integer or null"),
    "resumes": (_integer, "an integer"),
    "saw_done": (_boolean, "true or false"),
    "abandoned": (_boolean, "true or false"),
}
PIECE = ("a [display_time, text_piece] pair", "a list of [display_time, text_piece] pairs")
LIST_FIELDS: dict[str, tuple[Callable[[Any], bool], tuple[str, str]]] = {
    "chunks": (_piece, PIECE),
    "reasoning": (_piece, PIECE),
    "tool_calls_executed": (_object, ("an object", "a list of objects")),
    "json_acted_on": (_object, ("an object", "a list of objects")),
}


def shown(value: Any) -> str:
    """A wrong value as the message quotes it: its JSON, cut short."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SHOWN_VALUE else text[: SHOWN_VALUE - 3] + "..."


def _expected(where: str, what: str, value: Any) -> ResultError:
    return ResultError(f"{where}: expected {what}, got {shown(value)}")


def check_entry(entry: Any, where: str) -> None:
    """One entry of `results`, or the ResultError naming its first wrong field."""
    if not _object(entry):
        raise _expected(where, "an object", entry)
    if "index" not in entry:
        raise ResultError(f"{where}.index is missing (the workload request's index)")
    for name, (valid, what) in FIELDS.items():
        if name in entry and not valid(entry[name]):
            raise _expected(f"{where}.{name}", what, entry[name])
    for name, (valid, (one, many)) in LIST_FIELDS.items():
        if name not in entry:
            continue
        items = entry[name]
        if not isinstance(items, list):
            raise _expected(f"{where}.{name}", many, items)
        for number, item in enumerate(items):
            if not valid(item):
                raise _expected(f"{where}.{name}[{number}]", one, item)


def check_result(document: Any, requests: int) -> dict[str, Any]:
    """The decoded result file when it keeps the contract for a workload of `requests`
    requests; else the ResultError naming the first thing wrong. An entry per request is
    not required (the scorer judges a request without one a hang), but an index that is
    no request of the workload, or a second entry for one, is an error."""
    if not isinstance(document, dict):
        raise _expected("the result", 'an object {"client": ..., "results": [...]}', document)
    if "client" in document and not _string(document["client"]):
        raise _expected("client", "a string", document["client"])
    if "results" not in document:
        raise ResultError('"results" is missing (a list with an entry per workload request)')
    results = document["results"]
    if not isinstance(results, list):
        raise _expected("results", "a list of entries", results)
    seen: set[int] = set()
    for number, entry in enumerate(results):
        where = f"results[{number}]"
        check_entry(entry, where)
        index = entry["index"]
        if not 0 <= index < requests:
            raise ResultError(
                f"{where}.index: {index} is no request of the workload (0 to {requests - 1})"
            )
        if index in seen:
            raise ResultError(f"{where}.index: a second entry for request {index}")
        seen.add(index)
    return document


def read_result(data: bytes, requests: int) -> dict[str, Any]:
    """A result file's bytes, decoded and checked (`check_result`); a file that is not JSON
    is a ResultError with the parser's line and column."""
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ResultError(f"not UTF-8: byte {error.start} is {data[error.start]:#04x}") from None
    except json.JSONDecodeError as error:
        raise ResultError(
            f"not JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    return check_result(document, requests)
