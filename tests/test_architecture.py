"""The house rules (docs/architecture.md, shared/design.md "Layout: rooms"), enforced on the source.

Each rule is a plain function from source text (a mapping of repository-relative path to
source) to a list of violations, so every rule is shown twice: failing on a small violating
example written here, and passing on the real tree. A rule that only ever passes proves
nothing; a rule that can fail on three lines of code is one a reader can trust.

The rules cover the installed product (`middlebox`, `faults`, `vllm_emulator`: pyproject's
packages). tests/, bench/ and calibrate/ are harnesses around the house and may import
anything.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import sys
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import faults
from faults import REGISTRY
from middlebox.core.fault import Command, Effects, Fault, Pipeline
from middlebox.core.h2_faults import H2Action, H2Fault, H2Faults

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("middlebox", "faults", "vllm_emulator")
STDLIB = frozenset(sys.stdlib_module_names)

Sources = Mapping[str, str]


# -- The rooms and their rules ---------------------------------------------------------------


@dataclass(frozen=True)
class Room:
    """One room: its job, the rooms it may import, and the libraries it may (or may not) use."""

    job: str
    may_import: frozenset[str]
    #: third-party libraries allowed; None means any (then `forbidden` still applies)
    libraries: frozenset[str] | None = None
    #: modules never imported here, standard library included (dotted prefixes)
    forbidden: frozenset[str] = frozenset()


# Modules that do I/O or run an event loop: a pure room (core, scenario, faults) imports none of
# them, so everything there runs on a virtual clock in microseconds and replays from its seed.
IO_AND_EVENT_LOOPS = frozenset(
    {
        "trio",
        "aiohttp",
        "anyio",
        "asyncio",
        "socket",
        "ssl",
        "select",
        "selectors",
        "subprocess",
        "threading",
        "multiprocessing",
        "concurrent",
        "signal",
        "http.client",
        "http.server",
        "urllib.request",
        "scapy",
    }
)
EVENT_LOOPS = frozenset({"trio", "aiohttp", "anyio", "asyncio"})


def rooms(*names: str) -> frozenset[str]:
    return frozenset(names)


# The room of `middlebox/<room>/...` is <room>; `middlebox/compose.py` is the composition root;
# `middlebox/__init__.py` is the package itself (its version; it imports nothing) and
# `middlebox/__main__.py` belongs to the cli (`python -m middlebox` is the command line).
ROOMS: dict[str, Room] = {
    "core": Room(
        "the pure data model and framers: stream items, the fault contract, HTTP/1.1 and SSE "
        "framing, nginx-shaped responses",
        rooms(),
        libraries=frozenset(),
        forbidden=IO_AND_EVENT_LOOPS,
    ),
    "scenario": Room(
        "the YAML scenario format: units, converter, model, loading, presets, schema, workload",
        rooms("core"),
        libraries=frozenset({"yaml"}),
        forbidden=IO_AND_EVENT_LOOPS,
    ),
    "faults": Room(
        "one module per fault and the registry; pure state machines",
        rooms("core"),
        libraries=frozenset(),
        forbidden=IO_AND_EVENT_LOOPS,
    ),
    "library": Room(
        "the shipped library as package data: the scenarios (by name) and the drills",
        rooms(),
        libraries=frozenset({"yaml"}),
        forbidden=IO_AND_EVENT_LOOPS,
    ),
    "compose": Room(
        "the composition root: the only importer of faults",
        rooms("core", "scenario", "library", "faults", "vllm_emulator"),
    ),
    "observe": Room(
        "what happened on the wire: the journal (each leg framed once), metrics, pcap",
        rooms("core", "scenario"),
        forbidden=EVENT_LOOPS,
    ),
    "shell": Room(
        "the thin trio I/O shell: sockets, read hub, relay, server, workers, control API",
        rooms("core", "scenario", "observe"),
        forbidden=frozenset({"aiohttp", "asyncio", "anyio"}),
    ),
    "console": Room(
        "the live web console on --ui: a bounded model fed by the relay's observer, the "
        "classifier's words, its trio HTTP server and static page",
        rooms("core", "scenario", "observe", "report", "shell"),
        forbidden=frozenset({"aiohttp", "asyncio", "anyio"}),
    ),
    "report": Room(
        "views of a run's plain-data verdicts: scorecard, JUnit XML, HTML, timelines, progress",
        rooms("core", "scenario", "observe"),
    ),
    "clients": Room(
        "the built-in clients under test; separate processes with one small result contract",
        rooms("core"),
    ),
    "run": Room(
        "running scenarios for a verdict: upstream processes, clients, suite, scorer, "
        "background proxy, pytest plugin, drills",
        rooms(
            "core",
            "scenario",
            "library",
            "shell",
            "observe",
            "report",
            "console",
            "clients",
            "compose",
        ),
    ),
    "tools": Room(
        "load generation, the Locust file, soak, the cassette recorder, the probe upstream, "
        "the fingerprinter",
        rooms("core", "scenario", "shell", "observe", "run", "compose"),
    ),
    "cli": Room(
        "click only: each command parses its options and calls one function",
        rooms(
            "core",
            "scenario",
            "library",
            "shell",
            "observe",
            "report",
            "clients",
            "run",
            "tools",
            "console",
            "compose",
            "vllm_emulator",
        ),
    ),
    "middlebox": Room("the package: its version", rooms(), libraries=frozenset()),
    "vllm_emulator": Room("the embedded upstream, its own aiohttp process", rooms()),
}
# The rooms that are folders under middlebox/ (each with a docstring stating its rule).
MIDDLEBOX_ROOMS = sorted(set(ROOMS) - {"compose", "faults", "middlebox", "vllm_emulator"})
# Pure rooms: no wall clock, no sleep, no global random (time comes in as `now`, randomness from
# an injected seeded random.Random), so a fault's timeline is exact and a run replays from its seed.
PURE_ROOMS = frozenset({"core", "scenario", "faults"})
# Everything that builds pipelines from the fault library does it through this one module.
FAULTS_IMPORTERS = frozenset({"middlebox/compose.py"})
# click is the command line's library: the cli room, and the emulator's own `emulate` command.
CLICK_USERS = frozenset({"middlebox/cli/", "vllm_emulator/cli.py"})


# -- Reading source --------------------------------------------------------------------------


def module_name(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(path: str, source: str) -> list[tuple[int, str]]:
    """(line, dotted name) for every import anywhere in the module, lazy ones included.

    `from a.b import c` gives `a.b.c` (c may be a module or a name in a.b); relative imports
    are resolved against the module's package.
    """
    package = module_name(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return names


def room_of_path(path: str) -> str:
    parts = Path(path).parts
    if parts[0] != "middlebox":
        return parts[0]
    if len(parts) == 2:
        return {"compose.py": "compose", "__main__.py": "cli"}.get(parts[1], "middlebox")
    return parts[1]


def room_of_name(name: str) -> str | None:
    """The room an imported dotted name belongs to, or None for a library."""
    parts = name.split(".")
    if parts[0] in ("faults", "vllm_emulator"):
        return parts[0]
    if parts[0] != "middlebox":
        return None
    if len(parts) > 1 and (parts[1] in ROOMS or parts[1] == "compose"):
        return parts[1]
    return "middlebox"


@cache
def parsed(source: str) -> ast.Module:
    """A module's syntax tree, parsed once however many rules read it (none changes it)."""
    return ast.parse(source)


def shell_modules(sources: Sources) -> Iterator[tuple[str, ast.Module]]:
    """(path, syntax tree) of each module in the shell room: the one walk of the shell's
    sources that the rules about the shell share."""
    for path, source in sources.items():
        if room_of_path(path) == "shell":
            yield path, parsed(source)


def matches(name: str, prefixes: Iterable[str]) -> str | None:
    return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)


def read_tree(root: Path, packages: Iterable[str] = PRODUCT) -> dict[str, str]:
    return {
        str(path.relative_to(root)): path.read_text(encoding="utf-8")
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


@cache
def product() -> dict[str, str]:
    return read_tree(ROOT)


def assert_clean(violations: list[str]) -> None:
    assert not violations, "architecture violations:\n  " + "\n  ".join(violations)


# -- The rules -------------------------------------------------------------------------------


def room_import_violations(sources: Sources) -> list[str]:
    """Each module imports only the rooms and libraries its room's rule allows."""
    found = []
    for path, source in sources.items():
        room_name = room_of_path(path)
        room = ROOMS.get(room_name)
        if room is None:
            found.append(f"{path}: in no known room (add it to ROOMS with its rule)")
            continue
        reported: set[tuple[int, str]] = set()
        for line, name in imported_names(path, source):
            target = room_of_name(name)
            if target is not None:
                # one violation per import statement, however many names it takes
                if target not in room.may_import | {room_name, "middlebox"} and (
                    (line, target) not in reported
                ):
                    reported.add((line, target))
                    found.append(f"{path}:{line}: {room_name} imports {name} ({target})")
                continue
            if bad := matches(name, room.forbidden):
                found.append(f"{path}:{line}: {room_name} imports {bad}")
                continue
            library = name.split(".")[0]
            allowed = room.libraries
            third_party = library != "__future__" and library not in STDLIB
            if third_party and allowed is not None and library not in allowed:
                found.append(f"{path}:{line}: {room_name} imports the library {library}")
    return found


def faults_importers(sources: Sources) -> list[str]:
    """Only the composition root imports the fault library."""
    return [
        f"{path}:{line}: imports {name} (only {sorted(FAULTS_IMPORTERS)} may)"
        for path, source in sources.items()
        if room_of_path(path) != "faults" and path not in FAULTS_IMPORTERS
        for line, name in imported_names(path, source)
        if room_of_name(name) == "faults"
    ]


def click_outside_the_cli(sources: Sources) -> list[str]:
    """click appears only in the command lines; everything else is callable without it."""
    return [
        f"{path}:{line}: imports {name} (click belongs in middlebox/cli/)"
        for path, source in sources.items()
        if not any(path == user or path.startswith(user) for user in CLICK_USERS)
        for line, name in imported_names(path, source)
        if name.split(".")[0] == "click"
    ]


def both_event_loops(sources: Sources) -> list[str]:
    """No module imports both trio and asyncio/aiohttp: proxy and emulator share only TCP."""
    found = []
    for path, source in sources.items():
        tops = {name.split(".")[0] for _, name in imported_names(path, source)}
        if "trio" in tops and tops & {"aiohttp", "asyncio"}:
            found.append(f"{path}: imports trio and {sorted(tops & {'aiohttp', 'asyncio'})}")
    return found


WALL_CLOCKS = frozenset(
    {
        "time.time",
        "time.time_ns",
        "time.monotonic",
        "time.monotonic_ns",
        "time.perf_counter",
        "time.perf_counter_ns",
        "time.process_time",
        "time.process_time_ns",
        "time.thread_time",
        "time.clock_gettime",
        "time.clock_gettime_ns",
        "time.sleep",
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
        "os.urandom",
        "uuid.uuid1",
        "uuid.uuid4",
    }
)
# `random.Random` is the seeded instance faults are given; everything else in `random` is the
# hidden global generator (or the OS's, SystemRandom), which no seed replays.
SEEDED_RANDOM = "random.Random"


def aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted module or attribute it was imported as."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def dotted(node: ast.expr, bound: Mapping[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, bound)
        return f"{base}.{node.attr}" if base else None
    return None


# The emulator's pure modules (vllm_emulator/__init__.py): its wire format, timing model and
# text are plain functions, so the same bytes and timings are testable without a server.
EMULATOR_PURE = frozenset(
    f"vllm_emulator/{name}.py"
    for name in ("wire", "schedule", "textgen", "validation", "metrics", "config")
)


def emulator_pure_modules_doing_io(sources: Sources) -> list[str]:
    """The emulator's pure modules import no event loop, socket or other I/O module."""
    return [
        f"{path}:{line}: imports {bad}"
        for path, source in sources.items()
        if path in EMULATOR_PURE
        for line, name in imported_names(path, source)
        if (bad := matches(name, IO_AND_EVENT_LOOPS))
    ]


def clocks_and_global_random(sources: Sources) -> list[str]:
    """Pure rooms read no clock, never sleep, and draw randomness only from a seeded Random."""
    found = []
    for path, source in sources.items():
        if room_of_path(path) not in PURE_ROOMS:
            continue
        tree = ast.parse(source)
        bound = aliases(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and not (node.args or node.keywords)
                and dotted(node.func, bound) == SEEDED_RANDOM
            ):
                found.append(f"{path}:{node.lineno}: random.Random() without a seed")
            if not isinstance(node, ast.Name | ast.Attribute):
                continue
            name = dotted(node, bound)
            if name is None:
                continue
            if name in WALL_CLOCKS:
                found.append(f"{path}:{node.lineno}: uses {name} (time comes in as `now`)")
            elif name.startswith("random.") and name != SEEDED_RANDOM:
                found.append(f"{path}:{node.lineno}: uses the global {name} (use self.rng)")
            elif name.startswith("secrets."):
                found.append(f"{path}:{node.lineno}: uses {name} (use self.rng)")
    return found


def counters_by_name(sources: Sources) -> list[str]:
    """The shell counts by attribute (`ServerCounters`), typed: no `setattr` with a name
    computed at run time, and no arithmetic on a `getattr`, where a misspelt counter
    would be a new attribute or a silent default rather than mypy's error."""
    found = []
    for path, tree in shell_modules(sources):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                named = len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                if node.func.id == "setattr" and not named:
                    found.append(f"{path}:{node.lineno}: setattr by a computed name")
            operands: list[ast.expr] = []
            if isinstance(node, ast.BinOp):
                operands = [node.left, node.right]
            elif isinstance(node, ast.AugAssign):
                operands = [node.value]
            for operand in operands:
                if (
                    isinstance(operand, ast.Call)
                    and isinstance(operand.func, ast.Name)
                    and operand.func.id == "getattr"
                ):
                    found.append(f"{path}:{node.lineno}: arithmetic on a getattr")
    return found


COMMANDS = frozenset(kind.__name__ for kind in typing.get_args(Command))
H2_HOOKS = frozenset(
    name for name, value in vars(H2Fault).items() if callable(value) and not name.startswith("_")
)
# A stream fault's item hooks: the shell reaches them only through a `Pipeline`'s
# open/feed/wake, which answer with `Effects`.
FAULT_HOOKS = frozenset({"on_open", "on_item", "on_deadline"})


def commands_outside_apply(sources: Sources) -> list[str]:
    """One effect vocabulary: the shell hears what a connection's faults want only as
    `Effects` from their driver (`Pipeline`, `H2Faults`) and does it in an `apply`. So no
    shell code calls a fault's item hook or an `H2Fault`'s hook itself, and none outside a
    function named `apply` tells one `Command` from another (a second place that performs
    commands)."""
    found = []
    for path, tree in shell_modules(sources):
        in_apply: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "apply":
                in_apply.update(id(inner) for inner in ast.walk(node))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in H2_HOOKS:
                found.append(f"{path}:{node.lineno}: an HTTP/2 fault's {node.func.attr} called "
                             "outside H2Faults")  # fmt: skip
            if isinstance(node.func, ast.Attribute) and node.func.attr in FAULT_HOOKS:
                found.append(f"{path}:{node.lineno}: a fault's {node.func.attr} called "
                             "outside a Pipeline")  # fmt: skip
            named = isinstance(node.func, ast.Name) and node.func.id == "isinstance"
            if named and len(node.args) == 2 and id(node) not in in_apply:
                kinds = node.args[1]
                names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
                if any(isinstance(n, ast.Name) and n.id in COMMANDS for n in names):
                    found.append(f"{path}:{node.lineno}: a command performed outside apply")
    return found


def missing_docstrings(sources: Sources) -> list[str]:
    """Every module, empty package files included, starts by saying what it is for."""
    return [
        f"{path}: no module docstring"
        for path, source in sources.items()
        if not ast.get_docstring(ast.parse(source))
    ]


def rooms_without_a_rule(sources: Sources) -> list[str]:
    """Each folder under middlebox/ is a known room whose __init__ docstring states its rule."""
    found = []
    folders = {
        parts[1]
        for parts in (Path(path).parts for path in sources)
        if parts[0] == "middlebox" and len(parts) > 2
    }
    for folder in sorted(folders):
        if folder not in ROOMS:
            found.append(f"middlebox/{folder}/: a folder that is no room in ROOMS")
        init = sources.get(f"middlebox/{folder}/__init__.py")
        docstring = ast.get_docstring(ast.parse(init)) if init is not None else None
        if not docstring or "Rule:" not in docstring:
            found.append(f"middlebox/{folder}/__init__.py: its docstring states no 'Rule:'")
    return found


def shadowed_names(sources: Sources) -> list[str]:
    """No module or package is named after a stdlib module or a library it imports."""
    found = []
    for path, source in sources.items():
        parts = Path(path).with_suffix("").parts
        for part in parts:
            if part in STDLIB and part not in ("__init__", "__main__"):
                found.append(f"{path}: '{part}' shadows the standard library's {part}")
        stem = parts[-1]
        if any(name.split(".")[0] == stem for _, name in imported_names(path, source)):
            found.append(f"{path}: named after the library {stem} it imports")
    return found


def import_graph(sources: Sources) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports, lazy imports included (a lazy import only
    hides a circle); itself and outside modules left out.

    `from a.b import c` is an edge to `a.b` and, when c is a module, to `a.b.c` too: c may be a
    name defined in a.b, and importing the module a.b.c runs a.b's `__init__` first. `import
    a.b.c` is an edge to the longest of a.b.c, a.b, a that is a module here.
    """
    modules = {module_name(path): path for path in sources}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(sources[path])):
            if isinstance(node, ast.ImportFrom):
                base = imported_base(path, node)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    prefixes = (".".join(parts[:end]) for end in range(len(parts), 0, -1))
                    targets.add(next((p for p in prefixes if p in modules), alias.name))
        graph[module] = (targets & modules.keys()) - {module}
    return graph


def imported_base(path: str, node: ast.ImportFrom) -> str:
    """The module `from X import ...` names, relative imports resolved against the package."""
    base = node.module or ""
    if node.level:
        package = module_name(path).split(".")
        if not path.endswith("__init__.py"):
            package = package[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
    return base


def import_cycles(sources: Sources) -> list[str]:
    """No import circle between modules: each strongly connected component of more than one
    module is shown as a shortest import path from its first module back to itself."""
    graph = import_graph(sources)
    return [" -> ".join(circle_through(graph, c)) for c in strongly_connected(graph)]


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on a long import chain): the
    components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    def enter(node: str) -> tuple[str, Iterator[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return node, iter(sorted(graph.get(node, ())))

    for root in sorted(graph):
        if root in index:
            continue
        work = [enter(root)]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    work.append(enter(child))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


# The proxy's own types: what a running proxy is built from and the server itself. A class
# deriving from one of them (a worker's server, the controlled proxy) is one too.
PROXY_TYPES = frozenset({"ProxyConfig", "ProxyServer"})


def mentions_any(annotation: ast.expr | None) -> bool:
    """Whether an annotation names `Any` (`Any`, `typing.Any`, or inside a string)."""
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                parsed = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                continue
            if mentions_any(parsed):
                return True
    return False


def signature_annotations(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [extra for extra in (arguments.vararg, arguments.kwarg) if extra is not None]
    annotations = [argument.annotation for argument in every if argument.annotation is not None]
    return [*annotations, *([function.returns] if function.returns is not None else [])]


def any_in_proxy_signatures(sources: Sources) -> list[str]:
    """No `Any` in how a proxy is built or started: the fields and method signatures of the
    proxy's types (and every class deriving from them) and every function that takes or
    returns one (`run_proxy`, `run_workers` ...) are typed, so a misspelt or mistyped
    option fails in mypy rather than in a running proxy (no `**options: Any`)."""
    found = []
    for path, tree in shell_modules(sources):
        classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
        proxies = set(PROXY_TYPES)
        grew = True
        while grew:  # a class deriving from a proxy type, here or through another such class
            bases = {c.name: {b.id for b in c.bases if isinstance(b, ast.Name)} for c in classes}
            new = {name for name, of in bases.items() if of & proxies} - proxies
            proxies |= new
            grew = bool(new)
        checked: list[tuple[str, int, ast.expr]] = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in proxies:
                for item in node.body:
                    if isinstance(item, ast.AnnAssign):
                        name = ast.unparse(item.target)
                        checked.append((f"{node.name}.{name}", item.lineno, item.annotation))
                    elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        checked.extend(
                            (f"{node.name}.{item.name}", item.lineno, annotation)
                            for annotation in signature_annotations(item)
                        )
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                annotations = signature_annotations(node)
                named = {n.id for a in annotations for n in ast.walk(a) if isinstance(n, ast.Name)}
                if named & proxies:
                    checked.extend((node.name, node.lineno, a) for a in annotations)
        reported: set[tuple[str, int]] = set()
        for where, line, annotation in checked:
            if mentions_any(annotation) and (where, line) not in reported:
                reported.add((where, line))
                found.append(f"{path}:{line}: {where} has Any in its signature")
    return found


def circle_through(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself (breadth first,
    inside the component)."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def rooms_missing_from_readme(readme: str) -> list[str]:
    """The README's Architecture section names every room (`middlebox/core/`, `faults/`, ...)."""
    match = re.search(r"^## Architecture\n(.*?)(?=^## )", readme, re.S | re.M)
    if not match:
        return ["README.md: no '## Architecture' section"]
    section = match.group(1)
    wanted = [f"`middlebox/{room}/`" for room in MIDDLEBOX_ROOMS]
    wanted += ["`middlebox/compose.py`", "`faults/`", "`vllm_emulator/`"]
    return [
        f"README.md Architecture: {name} is not named" for name in wanted if name not in section
    ]


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def is_private(cls: type) -> bool:
    """A helper: a leading underscore on the class or on any module below faults/ (faults._lib)."""
    modules = cls.__module__.split(".")[1:]
    return cls.__name__.startswith("_") or any(part.startswith("_") for part in modules)


def unregistered_faults(classes: Iterable[type[Fault]], registry: Mapping[str, type]) -> list[str]:
    """Every public Fault subclass in faults/ is a registered fault; anything else is private.

    Public means: the class name and every module below `faults` lack a leading underscore.
    A public one must be `faults.<name>.<CamelCase(name)>`, carry `name = "<name>"` and be
    `REGISTRY["<name>"]`. A helper base or a building block lives in a private module
    (`faults/_lib/`) or has a private name, so the rule cannot miss a forgotten fault.
    """
    found = []
    for cls in classes:
        if is_private(cls):
            continue
        where = f"{cls.__module__}.{cls.__qualname__}"
        modules = cls.__module__.split(".")
        stem = modules[-1]
        if len(modules) != 2:
            found.append(f"{where}: a public fault must live in faults/<name>.py")
        elif cls.__name__ != camel(stem):
            found.append(f"{where}: the fault in faults/{stem}.py is named {camel(stem)}")
        elif cls.__dict__.get("name") != stem:
            found.append(f"{where}: sets no `name = {stem!r}` of its own")
        elif registry.get(stem) is not cls:
            found.append(f"{where}: not REGISTRY[{stem!r}] in faults/__init__.py")
    return found


def misplaced_registry_entries(registry: Mapping[str, type]) -> list[str]:
    """REGISTRY[name] is the class CamelCase(name) from faults/<name>.py with that `name`."""
    found = []
    for name, cls in registry.items():
        expected = f"faults.{name}.{camel(name)}"
        if f"{cls.__module__}.{cls.__qualname__}" != expected or cls.__dict__.get("name") != name:
            found.append(f"REGISTRY[{name!r}] is {cls.__module__}.{cls.__qualname__}")
    return found


def fault_classes_in(package_path: Iterable[str], prefix: str) -> list[type[Fault]]:
    """Every Fault subclass defined in the package's modules (imports them all)."""
    found: list[type[Fault]] = []
    for info in pkgutil.walk_packages(list(package_path), prefix):
        module = importlib.import_module(info.name)
        found.extend(
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Fault) and cls.__module__ == module.__name__
        )
    return found


# -- Each rule fails on a small violation ----------------------------------------------------

CLEAN = '"""A docstring."""\n'


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("middlebox/core/x.py", "import trio\n", "core imports trio"),
        ("middlebox/core/x.py", "import socket\n", "core imports socket"),
        ("middlebox/core/x.py", "import yaml\n", "core imports the library yaml"),
        ("middlebox/core/x.py", "from middlebox.scenario import model\n", "core imports"),
        ("middlebox/scenario/x.py", "from middlebox.shell import server\n", "scenario imports"),
        ("middlebox/scenario/x.py", "import trio\n", "scenario imports trio"),
        ("faults/x.py", "from middlebox.scenario.model import Scenario\n", "faults imports"),
        ("faults/x.py", "import httpx\n", "faults imports the library httpx"),
        ("faults/x.py", "import asyncio\n", "faults imports asyncio"),
        ("middlebox/shell/x.py", "import aiohttp\n", "shell imports aiohttp"),
        ("middlebox/shell/x.py", "from middlebox.run import runner\n", "shell imports"),
        ("middlebox/shell/x.py", "from middlebox.compose import f\n", "shell imports"),
        ("middlebox/shell/x.py", "from middlebox import report\n", "shell imports"),
        ("middlebox/observe/x.py", "import trio\n", "observe imports trio"),
        ("middlebox/observe/x.py", "from middlebox.shell import relay\n", "observe imports"),
        ("middlebox/report/x.py", "from middlebox.run.runner import x\n", "report imports"),
        ("middlebox/report/x.py", "from middlebox.tools import soak\n", "report imports"),
        ("middlebox/run/x.py", "from middlebox.cli.main import main\n", "run imports"),
        ("middlebox/run/x.py", "from middlebox.tools import load\n", "run imports"),
        ("middlebox/clients/x.py", "from middlebox.shell import relay\n", "clients imports"),
        ("middlebox/tools/x.py", "from middlebox.cli import main\n", "tools imports"),
        ("middlebox/newroom/x.py", "", "in no known room"),
        ("vllm_emulator/x.py", "from middlebox.core import sse\n", "vllm_emulator imports"),
        ("vllm_emulator/x.py", "import faults\n", "vllm_emulator imports faults"),
        ("middlebox/core/x.py", "from . import y\nfrom ..shell import relay\n", "core imports"),
    ],
)
def test_the_room_rule_rejects_an_import_across_it(path: str, source: str, expected: str) -> None:
    violations = room_import_violations({path: source})
    assert len(violations) == 1 and expected in violations[0], violations


def test_the_room_rule_allows_what_each_room_may_import() -> None:
    allowed = {
        "middlebox/core/x.py": "import re\nfrom middlebox.core.stream import Chunk\n",
        "middlebox/scenario/x.py": "import yaml\nfrom middlebox.core import http1\n",
        "faults/x.py": "from faults._lib import timing\nfrom middlebox.core.fault import Fault\n",
        "middlebox/shell/x.py": "import trio\nfrom middlebox.observe import journal\n",
        "middlebox/observe/x.py": "import scapy\nfrom middlebox.scenario import model\n",
        "middlebox/run/x.py": "import trio\nfrom middlebox import compose, report, shell\n",
        "middlebox/cli/main.py": "import click\nfrom middlebox.tools import soak\n",
        "middlebox/__main__.py": "from middlebox.cli.main import main\n",
        "vllm_emulator/app.py": "import aiohttp\nfrom vllm_emulator import wire\n",
    }
    assert room_import_violations(allowed) == []


def test_only_the_composition_root_imports_faults() -> None:
    sources = {
        "middlebox/compose.py": "from faults import REGISTRY\n",
        "faults/cut.py": "from faults._lib import ends\n",
        "middlebox/run/runner.py": "def f():\n    from faults.presets import PRESETS\n",
        "middlebox/cli/main.py": "import faults.latency\n",
    }
    violations = faults_importers(sources)
    assert [v.split(":")[0] for v in violations] == [
        "middlebox/run/runner.py",
        "middlebox/cli/main.py",
    ]


def test_click_appears_only_in_the_cli() -> None:
    sources = {
        "middlebox/cli/main.py": "import click\n",
        "vllm_emulator/cli.py": "import click\n",
        "middlebox/report/scorecard.py": "import click\n",
        "vllm_emulator/app.py": "from click import echo\n",
    }
    violations = click_outside_the_cli(sources)
    paths = [v.split(":")[0] for v in violations]
    assert paths == ["middlebox/report/scorecard.py", "vllm_emulator/app.py"]


def test_a_module_importing_both_event_loops_is_caught() -> None:
    sources = {
        "middlebox/shell/a.py": "import trio\ndef f():\n    import aiohttp\n",
        "middlebox/shell/b.py": "import trio\nimport asyncio\n",
        "middlebox/shell/c.py": "import trio\n",
        "vllm_emulator/app.py": "import asyncio\nimport aiohttp\n",
    }
    paths = [v.split(":")[0] for v in both_event_loops(sources)]
    assert paths == ["middlebox/shell/a.py", "middlebox/shell/b.py"]


def test_an_emulator_pure_module_doing_io_is_caught() -> None:
    sources = {
        "vllm_emulator/wire.py": "import json\n",
        "vllm_emulator/schedule.py": "def f():\n    import asyncio\n",
        "vllm_emulator/app.py": "import aiohttp\n",
    }
    assert emulator_pure_modules_doing_io(sources) == [
        "vllm_emulator/schedule.py:2: imports asyncio"
    ]


@pytest.mark.parametrize(
    "body",
    [
        "import time\ndef on_item(self, item, now):\n    return time.time()\n",
        "import time\nstarted = time.monotonic()\n",
        "import time as clock\nx = clock.perf_counter()\n",
        "from time import monotonic\ndef deadline(self):\n    return monotonic() + 1\n",
        "from time import sleep\nsleep(0.1)\n",
        "import datetime\nstamp = datetime.datetime.now()\n",
        "from datetime import datetime\nstamp = datetime.now()\n",
        "from datetime import date\nday = date.today()\n",
        "import random\ndef on_item(self, item, now):\n    return random.random()\n",
        "import random\npick = random.choice([1, 2])\n",
        "from random import randint\nn = randint(1, 6)\n",
        "import random\nrandom.seed(4)\n",
        "import random\nrng = random.SystemRandom()\n",
        "import random\nrng = random.Random()\n",
        "import secrets\ntoken = secrets.token_hex(8)\n",
        "import os\nnoise = os.urandom(4)\n",
        "import uuid\nident = uuid.uuid4()\n",
    ],
)
@pytest.mark.parametrize("path", ["faults/x.py", "middlebox/core/x.py", "middlebox/scenario/x.py"])
def test_a_wall_clock_or_the_global_random_in_a_pure_room_is_caught(path: str, body: str) -> None:
    assert len(clocks_and_global_random({path: body})) == 1


def test_seeded_randomness_and_now_are_what_pure_rooms_use() -> None:
    fault = (
        "import random\n"
        "from dataclasses import dataclass, field\n"
        "@dataclass\n"
        "class Jitter:\n"
        "    rng: random.Random = field(default_factory=lambda: random.Random(7))\n"
        "    def on_item(self, item, now: float, time: float = 0.0):\n"
        "        self.rng.random()\n"
        "        return [item] if self.rng.choice([True, False]) else []\n"
    )
    assert clocks_and_global_random({"faults/jitter.py": fault}) == []
    # The shell and the runner live on real clocks: the rule is for pure rooms only.
    shell = "import time\nstarted = time.monotonic()\n"
    assert clocks_and_global_random({"middlebox/shell/server.py": shell}) == []


@pytest.mark.parametrize(
    "body",
    [
        "def count(self, counter):\n    setattr(self, counter, getattr(self, counter) + 1)\n",
        "def count(server, name):\n    setattr(server, name, 0)\n",
        "def total(server, name):\n    return getattr(server, name, 0) + 1\n",
        "def add(server, name, n):\n    n += getattr(server, name)\n",
    ],
)
def test_a_counter_kept_by_name_in_the_shell_is_caught(body: str) -> None:
    assert counters_by_name({"middlebox/shell/x.py": body})


def test_the_shell_rules_walk_the_shell_room_alone_parsing_each_module_once() -> None:
    shell = "def apply(x):\n    return x\n"
    sources = {
        "middlebox/shell/a.py": shell,
        "middlebox/shell/tls/b.py": "B = 1\n",
        "middlebox/core/shell.py": "C = 1\n",
        "faults/shell.py": "D = 1\n",
    }
    walked = dict(shell_modules(sources))
    assert list(walked) == ["middlebox/shell/a.py", "middlebox/shell/tls/b.py"]
    assert walked["middlebox/shell/a.py"] is parsed(shell)  # the same tree for every rule
    assert ast.unparse(walked["middlebox/shell/tls/b.py"]) == "B = 1"


def test_counters_by_attribute_and_reading_fields_by_name_are_allowed() -> None:
    sources = {
        "middlebox/shell/x.py": (
            "def count(counters):\n    counters.header_timeouts += 1\n"
            "def fields(value, names):\n    return {n: getattr(value, n) for n in names}\n"
            "def mark(sock):\n    setattr(sock, 'tagged', True)\n"
        ),
        # Only the shell is held to it.
        "middlebox/report/x.py": "def f(o, n):\n    setattr(o, n, getattr(o, n) + 1)\n",
    }
    assert counters_by_name(sources) == []


@pytest.mark.parametrize(
    "body",
    [
        "def execute(self, actions):\n    for a in actions:\n"
        "        if isinstance(a, ResetStream):\n            self.reset(a.stream_id)\n",
        "def drop(self, a):\n    return isinstance(a, (SendGoaway, DropConnection))\n",
        "def opened(self, stream_id, now):\n"
        "    for fault in self.faults:\n        fault.on_stream_open(stream_id, now)\n",
        "def due(self):\n    return min(f.h2_deadline() for f in self.faults)\n",
        # a stage driven by hand beside the pipeline (a second driver of stream faults)
        "async def alone(client, stage, now):\n    out = stage.on_open(now)\n",
        "def fed(stage, item, now):\n    return stage.on_item(item, now)\n",
        "def woken(stage, now):\n    return stage.on_deadline(now)\n",
    ],
)
def test_a_second_place_performing_commands_in_the_shell_is_caught(body: str) -> None:
    assert commands_outside_apply({"middlebox/shell/x.py": body})


def test_commands_performed_in_apply_and_other_isinstance_checks_are_allowed() -> None:
    sources = {
        "middlebox/shell/x.py": (
            "def apply(self, effects):\n    for command in effects.commands:\n"
            "        if isinstance(command, ResetStream):\n            self.reset(command)\n"
            "def read(self, item):\n    return isinstance(item, Chunk)\n"
            "def opened(self, stream_id, now):\n"
            "    self.apply(self.h2.stream_open(stream_id, now))\n"
            "def alone(self, stage, now):\n"
            "    return Pipeline([stage]).open(now)\n"
        ),
        # Only the shell performs commands; the faults and the core make them.
        "faults/x.py": "def f(a):\n    return isinstance(a, ResetStream)\n",
    }
    assert commands_outside_apply(sources) == []


def test_the_drivers_answer_effects_and_http2_actions_are_its_commands() -> None:
    # The shell's calls into a connection's faults answer the one vocabulary, `Effects`.
    for driver, names in (
        (Pipeline, ("open", "feed", "wake")),
        (H2Faults, ("open", "stream_open", "stream_data", "stream_close", "wake")),
    ):
        for name in names:
            hints = typing.get_type_hints(getattr(driver, name))
            assert hints["return"] is Effects, f"{driver.__name__}.{name}"
    assert typing.get_args(H2Action) == typing.get_args(Command)
    hook_answers = [
        typing.get_type_hints(getattr(H2Fault, name))["return"]
        for name in sorted(H2_HOOKS)
        if name.startswith("on_")
    ]
    assert hook_answers and all(answer == list[H2Action] for answer in hook_answers)


def test_any_in_how_a_proxy_is_built_or_started_is_caught() -> None:
    server = (
        "from typing import Any\n"
        "class ProxyServer:\n"
        "    def __init__(self, upstream: str, **options: Any) -> None: ...\n"
        "class WorkerServer(ProxyServer):\n"
        "    extra: 'dict[str, Any]'\n"
        "class ControlledProxy(WorkerServer):\n"
        "    def observer(self, connection_id: int) -> typing.Any: ...\n"
    )
    workers = (
        "def run_workers(config: ProxyConfig, workers: int, **server_options: Any) -> None: ...\n"
        "async def run_proxy(address: str, *, server: ProxyServer | None, **o: Any) -> None: ...\n"
    )
    sources = {"middlebox/shell/server.py": server, "middlebox/shell/workers.py": workers}
    assert any_in_proxy_signatures(sources) == [
        "middlebox/shell/server.py:3: ProxyServer.__init__ has Any in its signature",
        "middlebox/shell/server.py:5: WorkerServer.extra has Any in its signature",
        "middlebox/shell/server.py:7: ControlledProxy.observer has Any in its signature",
        "middlebox/shell/workers.py:1: run_workers has Any in its signature",
        "middlebox/shell/workers.py:2: run_proxy has Any in its signature",
    ]


def test_any_away_from_how_a_proxy_is_built_is_left_alone() -> None:
    server = (
        "from typing import Any\n"
        "@dataclass\n"
        "class ProxyServer:\n"
        "    config: ProxyConfig\n"
        "    async def serve(self, listener: socket.socket) -> None:\n"
        "        seen: Any = None\n"  # a local, not the signature
        "def state_scope(scenario: str, config: Any) -> str: ...\n"  # takes no proxy
        "class ControlApi:\n"  # not a proxy type
        "    def json(self, value: Any) -> Any: ...\n"
    )
    outside = "class ProxyServer:\n    def __init__(self, **options: Any) -> None: ...\n"
    sources = {"middlebox/shell/server.py": server, "middlebox/run/other.py": outside}
    assert any_in_proxy_signatures(sources) == []


def test_a_module_without_a_docstring_is_caught() -> None:
    sources = {"faults/a.py": CLEAN, "faults/b.py": "import re\n", "middlebox/run/__init__.py": ""}
    assert missing_docstrings(sources) == [
        "faults/b.py: no module docstring",
        "middlebox/run/__init__.py: no module docstring",
    ]


def test_a_room_folder_without_a_stated_rule_is_caught() -> None:
    sources = {
        "middlebox/core/__init__.py": '"""core: pure.\n\nRule: stdlib only."""\n',
        "middlebox/core/stream.py": CLEAN,
        "middlebox/shell/__init__.py": '"""shell: sockets."""\n',
        "middlebox/shell/relay.py": CLEAN,
        "middlebox/misc/thing.py": CLEAN,
        "middlebox/compose.py": CLEAN,
    }
    assert rooms_without_a_rule(sources) == [
        "middlebox/misc/: a folder that is no room in ROOMS",
        "middlebox/misc/__init__.py: its docstring states no 'Rule:'",
        "middlebox/shell/__init__.py: its docstring states no 'Rule:'",
    ]


def test_a_module_shadowing_the_stdlib_or_its_library_is_caught() -> None:
    sources = {
        "faults/gzip.py": CLEAN,
        "faults/gzip_encoding.py": "import zlib\n",
        "middlebox/clients/openai.py": "from openai import OpenAI\n",
        "middlebox/clients/openai_sdk.py": "from openai import OpenAI\n",
    }
    assert shadowed_names(sources) == [
        "faults/gzip.py: 'gzip' shadows the standard library's gzip",
        "middlebox/clients/openai.py: named after the library openai it imports",
    ]


def test_an_import_circle_is_caught_even_through_a_lazy_import() -> None:
    sources = {
        "middlebox/run/runner.py": "from middlebox.report.scorecard import render\n",
        "middlebox/report/scorecard.py": "def f():\n    from middlebox.run import runner\n",
        "middlebox/report/html_page.py": "from middlebox.report import scorecard\n",
        "middlebox/core/stream.py": CLEAN,
    }
    assert import_cycles(sources) == [
        "middlebox.report.scorecard -> middlebox.run.runner -> middlebox.report.scorecard"
    ]


def test_a_longer_circle_through_a_relative_import_is_shown_as_its_shortest_path() -> None:
    sources = {
        "pkg/__init__.py": "",
        "pkg/run/__init__.py": "",
        "pkg/run/suite.py": "from ..report import html\n",
        "pkg/report/__init__.py": "",
        "pkg/report/html.py": "from . import layout\n",
        "pkg/report/layout.py": "import pkg.run.suite\nfrom pkg.report import html\n",
    }
    # two circles share html and layout: one component, shown by its shortest way round
    assert import_cycles(sources) == ["pkg.report.html -> pkg.report.layout -> pkg.report.html"]
    sources["pkg/report/layout.py"] = "import pkg.run.suite\n"
    assert import_cycles(sources) == [
        "pkg.report.html -> pkg.report.layout -> pkg.run.suite -> pkg.report.html"
    ]


def test_a_chain_without_a_way_back_is_no_circle_until_its_end_imports_the_start() -> None:
    sources = {
        "pkg/__init__.py": "from pkg import a\n",
        "pkg/a.py": "from pkg.b import thing\nimport json\n",
        "pkg/b.py": "from pkg.c import other\n",
        "pkg/c.py": "other = 1\n",
    }
    graph = import_graph(sources)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}  # json is not ours
    assert graph["pkg"] == {"pkg.a"}  # a package importing its child is no edge to itself
    assert import_cycles(sources) == []
    sources["pkg/c.py"] = "import pkg\n"  # the package, whose __init__ imports a
    assert import_cycles(sources) == ["pkg -> pkg.a -> pkg.b -> pkg.c -> pkg"]


def test_importing_a_module_from_its_package_is_an_edge_to_the_package_too() -> None:
    # `from pkg.sub import mod` runs pkg/sub/__init__.py first: a circle through it counts
    sources = {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from pkg.user import helper\n",
        "pkg/sub/mod.py": "",
        "pkg/user.py": "from pkg.sub import mod\nhelper = 1\n",
    }
    assert import_graph(sources)["pkg.user"] == {"pkg.sub", "pkg.sub.mod"}
    assert import_cycles(sources) == ["pkg.sub -> pkg.user -> pkg.sub"]


def test_a_room_missing_from_the_readme_is_caught() -> None:
    named = " ".join(f"`middlebox/{room}/`" for room in MIDDLEBOX_ROOMS if room != "observe")
    readme = f"## Architecture\n{named} `faults/` `vllm_emulator/`\n## Commands\n"
    assert rooms_missing_from_readme(readme) == [
        "README.md Architecture: `middlebox/observe/` is not named",
        "README.md Architecture: `middlebox/compose.py` is not named",
    ]


class Nameless(Fault):
    """Forgot `name` and the registry: the case the old test let through."""


class Unregistered(Fault):
    name = "unregistered"


class _Helper(Fault):
    """A private building block: no registration needed."""


class Latency(Fault):
    """Right module and name, but not the class the registry holds."""

    name = "latency"


class WrongName(Fault):
    name = "wrong_name"


Nameless.__module__ = "faults.nameless"
Unregistered.__module__ = "faults.unregistered"
_Helper.__module__ = "faults.cut"
Latency.__module__ = "faults.latency"
WrongName.__module__ = "faults.different"


def test_a_public_fault_subclass_that_is_not_registered_is_caught() -> None:
    registry = {"unregistered": Unregistered}
    classes = [Nameless, Unregistered, _Helper, Latency, WrongName]
    violations = unregistered_faults(classes, {**registry, "latency": REGISTRY["latency"]})
    assert violations == [
        "faults.nameless.Nameless: sets no `name = 'nameless'` of its own",
        "faults.latency.Latency: not REGISTRY['latency'] in faults/__init__.py",
        "faults.different.WrongName: the fault in faults/different.py is named Different",
    ]


class Timer(Fault):
    """A building block in a private module (faults/_lib/): a helper."""


class Hidden(Fault):
    name = "hidden"


Timer.__module__ = "faults._lib.timing"
Hidden.__module__ = "faults.extra.hidden"


def test_a_fault_in_a_private_module_is_a_helper_but_one_in_a_public_subpackage_is_caught() -> None:
    assert unregistered_faults([Timer, Hidden], {"hidden": Hidden}) == [
        "faults.extra.hidden.Hidden: a public fault must live in faults/<name>.py"
    ]


def test_a_registry_entry_under_the_wrong_name_is_caught() -> None:
    assert misplaced_registry_entries({"unregistered": Unregistered, "slow": Latency}) == [
        "REGISTRY['slow'] is faults.latency.Latency"
    ]


# -- The real tree keeps every rule ----------------------------------------------------------


def test_every_module_imports_only_what_its_room_allows() -> None:
    assert_clean(room_import_violations(product()))


def test_only_middlebox_compose_imports_the_fault_library() -> None:
    assert_clean(faults_importers(product()))


def test_click_is_imported_only_by_the_command_lines() -> None:
    assert_clean(click_outside_the_cli(product()))


def test_no_module_imports_both_trio_and_aiohttp() -> None:
    assert_clean(both_event_loops(product()))


def test_the_emulators_pure_modules_do_no_io() -> None:
    assert_clean(emulator_pure_modules_doing_io(product()))


def test_faults_and_the_pure_rooms_read_no_clock_and_no_global_random() -> None:
    assert_clean(clocks_and_global_random(product()))


def test_the_shell_keeps_no_counter_by_name() -> None:
    assert_clean(counters_by_name(product()))


def test_the_shell_performs_commands_only_in_apply() -> None:
    assert_clean(commands_outside_apply(product()))


def test_every_module_starts_with_a_docstring() -> None:
    assert_clean(missing_docstrings(product()))


def test_every_folder_under_middlebox_is_a_room_with_a_stated_rule() -> None:
    assert_clean(rooms_without_a_rule(product()))


def test_no_module_shadows_the_stdlib_or_a_library_it_drives() -> None:
    assert_clean(shadowed_names(product()))


def test_the_import_graph_sees_the_modules_and_their_imports() -> None:
    graph = import_graph(product())
    assert "middlebox.report.scorecard" in graph["middlebox.run.suite"]
    assert "middlebox.core.fault" in graph["faults.cut"]
    assert any(module.startswith("vllm_emulator.") for module in graph)


def test_there_is_no_import_circle() -> None:
    assert_clean(import_cycles(product()))


def test_the_readme_names_every_room() -> None:
    assert_clean(rooms_missing_from_readme((ROOT / "README.md").read_text(encoding="utf-8")))


def test_every_public_fault_subclass_is_registered_under_its_module_name() -> None:
    assert_clean(unregistered_faults(fault_classes_in(faults.__path__, "faults."), REGISTRY))


def test_each_registry_entry_is_the_camelcase_class_of_its_module() -> None:
    assert_clean(misplaced_registry_entries(REGISTRY))


def test_a_proxy_is_built_and_started_with_typed_options_only() -> None:
    assert_clean(any_in_proxy_signatures(product()))
