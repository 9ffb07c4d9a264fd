"""Test lines at least code lines (shared/design.md, conventions 1).

Counted as physical lines of `.py` files: tests/ against the installed product (middlebox/,
faults/, vllm_emulator/). Blank lines and docstrings count on both sides alike, so the ratio
is the one a reader sees in `wc -l`.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ("middlebox", "faults", "vllm_emulator")
TESTS = ("tests",)
# The convention (shared/design.md): at least one test line per code line.
MINIMUM_RATIO = 1.0


def lines_of_python(root: Path, folders: tuple[str, ...]) -> int:
    return sum(
        len(path.read_text(encoding="utf-8").splitlines())
        for folder in folders
        for path in (root / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def too_few_test_lines(root: Path) -> list[str]:
    """One violation when tests/ has fewer lines than the code it tests."""
    tests, code = lines_of_python(root, TESTS), lines_of_python(root, CODE)
    if tests >= MINIMUM_RATIO * code:
        return []
    return [
        f"{tests} test lines for {code} code lines: ratio {tests / code:.2f} < {MINIMUM_RATIO:.2f}"
    ]


def test_the_ratio_rule_fails_when_code_outgrows_its_tests(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "faults").mkdir()
    (tmp_path / "tests" / "test_cut.py").write_text("def test_cut():\n    assert True\n")
    (tmp_path / "faults" / "cut.py").write_text('"""cut."""\n\n\ndef cut():\n    pass\n')
    assert too_few_test_lines(tmp_path) == ["2 test lines for 5 code lines: ratio 0.40 < 1.00"]
    (tmp_path / "tests" / "test_more.py").write_text("x = 1\ny = 2\nz = 3\n")
    assert too_few_test_lines(tmp_path) == []


def test_there_is_at_least_one_test_line_per_code_line() -> None:
    assert too_few_test_lines(ROOT) == []
