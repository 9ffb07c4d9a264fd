"""Architecture rules from shared/design.md, enforced on the source tree (AST only)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import faults
from faults import REGISTRY
from middlebox.core.fault import Fault

ROOT = Path(__file__).resolve().parent.parent
PURE_CORE = [
    "core/stream",
    "core/fault",
    "core/http1",
    "core/sse",
    "scenario/model",
    "core/responses",
]
EVENT_LOOPS_AND_SOCKETS = {"trio", "aiohttp", "asyncio", "socket", "scapy", "selectors", "anyio"}
COMPOSITION_ROOT = {"cli", "compose", "runner", "plugin"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_the_pure_core_imports_no_event_loop_socket_or_packet_library() -> None:
    for module in PURE_CORE:
        path = ROOT / "middlebox" / f"{module}.py"
        if not path.exists():
            continue
        bad = {name for name in imported_modules(path) if top(name) in EVENT_LOOPS_AND_SOCKETS}
        assert not bad, f"middlebox/{module}.py imports {sorted(bad)}"


def test_faults_depend_only_on_the_pure_core() -> None:
    allowed_core = {f"middlebox.{module}".replace("/", ".") for module in PURE_CORE}
    for path in python_files("faults"):
        for name in imported_modules(path):
            if top(name) in EVENT_LOOPS_AND_SOCKETS:
                raise AssertionError(f"{path.relative_to(ROOT)} imports {name}")
            if top(name) == "middlebox":
                assert name in allowed_core, f"{path.relative_to(ROOT)} imports {name}"
            assert top(name) != "vllm_emulator", f"{path.relative_to(ROOT)} imports {name}"


def test_the_emulator_imports_neither_middlebox_nor_faults() -> None:
    for path in python_files("vllm_emulator"):
        bad = {name for name in imported_modules(path) if top(name) in {"middlebox", "faults"}}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_middlebox_imports_faults_only_at_the_composition_root() -> None:
    for path in python_files("middlebox"):
        if path.stem in COMPOSITION_ROOT:
            continue
        bad = {name for name in imported_modules(path) if top(name) == "faults"}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_module_imports_both_trio_and_aiohttp() -> None:
    for package in ("middlebox", "faults", "vllm_emulator"):
        for path in python_files(package):
            tops = {top(name) for name in imported_modules(path)}
            assert not {"trio", "aiohttp"} <= tops, f"{path.relative_to(ROOT)} mixes event loops"


def test_every_module_starts_with_a_docstring() -> None:
    for package in ("middlebox", "faults", "vllm_emulator"):
        for path in python_files(package):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if not tree.body:
                continue  # an empty __init__.py
            assert ast.get_docstring(tree), f"{path.relative_to(ROOT)} has no module docstring"


def all_fault_classes() -> dict[str, type[Fault]]:
    found: dict[str, type[Fault]] = {}
    for info in pkgutil.iter_modules(faults.__path__):
        module = importlib.import_module(f"faults.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, Fault)
                and cls.__module__ == module.__name__
                and not inspect.isabstract(cls)
                and not cls.__name__.startswith("_")
            ):
                found[f"{module.__name__}.{cls.__name__}"] = cls
    return found


def test_every_fault_subclass_is_in_the_registry() -> None:
    registered = set(REGISTRY.values())
    missing = [
        name
        for name, cls in all_fault_classes().items()
        if cls not in registered and "name" in cls.__dict__
    ]
    assert not missing, f"faults missing from faults/__init__.py REGISTRY: {missing}"


def test_each_fault_lives_in_the_module_of_its_yaml_name_under_its_camelcase_class() -> None:
    for name, cls in REGISTRY.items():
        assert cls.__module__ == f"faults.{name}", f"{name} is defined in {cls.__module__}"
        assert cls.__name__ == "".join(part.capitalize() for part in name.split("_")), name
