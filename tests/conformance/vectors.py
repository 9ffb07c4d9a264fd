"""Loading the shared conformance vectors (other projects' data, read in place).

They live in the repository's parent's `shared/conformance/` (CI puts a copy of shared/
beside its fresh clone). Under CI=true a missing folder fails the run; on a dev machine
the suite skips.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from middlebox.core.http1 import Role

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO.parent / "shared" / "conformance"


def folder() -> Path:
    if not (FOLDER / "README.md").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"conformance vectors missing: {FOLDER} (CI must provide shared/)")
        pytest.skip(f"conformance vectors not here: {FOLDER}")
    return FOLDER


def load(name: str) -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = json.loads((folder() / name).read_text())["vectors"]
    return vectors


@dataclass(frozen=True)
class HttpVector:
    """One HTTP input: where it came from, which side sends it, its bytes, and whether
    its source says a strict parser refuses it (None: the source says nothing)."""

    ident: str
    role: Role
    data: bytes
    error: bool | None


# llhttp logs its pause after an upgrade or CONNECT head as an error (code 22,
# HPE_PAUSED_UPGRADE: the caller takes the rest of the stream over); it is no refusal.
_LLHTTP_PAUSE = "error code=22 "


def _refuses(line: str) -> bool:
    return " error " in line and _LLHTTP_PAUSE not in line


def _llhttp(vector: dict[str, Any]) -> HttpVector | None:
    kind = vector["meta"]["type"]
    if not kind.startswith(("request", "response")):
        return None
    role: Role = "request" if kind.startswith("request") else "response"
    lenient = "lenient" in kind  # lenient flags: strict llhttp would refuse, not stated
    error = None if lenient else any(_refuses(line) for line in vector["log"])
    return HttpVector(vector["source"], role, vector["input_latin1"].encode("latin-1"), error)


def http_vectors() -> list[HttpVector]:
    out: list[HttpVector] = []
    for vector in load("llhttp.json"):
        found = _llhttp(vector)
        if found is not None:
            out.append(found)
    for vector in load("http_parser.json"):
        if vector["type"] in ("HTTP_REQUEST", "HTTP_RESPONSE"):
            role: Role = "request" if vector["type"] == "HTTP_REQUEST" else "response"
            ident = f"{vector['source']} {vector['name']}"
            out.append(HttpVector(ident, role, vector["raw_latin1"].encode("latin-1"), False))
    for vector in load("h11.json"):
        data = vector["input"].encode("latin-1")
        out.append(HttpVector(vector["source"], vector["role"], data, vector["expect"]["error"]))
    for vector in load("smuggling.json"):
        out.append(
            HttpVector(vector["name"], vector["role"], vector["input"].encode("latin-1"), None)
        )
    return out
