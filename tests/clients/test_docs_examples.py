"""The own-client examples users copy (docs/clients.md's, run by test_builtin_clients, and
the README's): they write the result atomically, as the contract requires, and never
claim an attempt count they cannot see (the SDK retries inside `create()`; the scorer
counts attempts on the wire)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def python_block(document: str, after: str) -> str:
    return document.split(after, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


EXAMPLES = {
    "docs/clients.md": "<!-- example-client:",
    "README.md": "## Scoring your own client",
}


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_the_own_client_example_writes_atomically_and_reports_no_invented_attempts(
    path: str,
) -> None:
    block = python_block((REPO / path).read_text(encoding="utf-8"), EXAMPLES[path])
    assert "os.replace(" in block and ".tmp" in block  # temp file, then a rename
    assert '"attempts": 1' not in block and '"attempts"' not in block
    assert "finish_reason" in block  # so length is not hidden from the scorer


def test_the_contract_says_attempts_are_a_cross_check_of_the_wire() -> None:
    text = (REPO / "docs" / "clients.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `attempts` |"))
    assert "optional" in row and "wire" in row and "client.attempts_mismatch" in row
