"""`make matrix`: every scenario against every built-in client, as one compatibility table.

The clients run over the whole scenario library in small batches, one batch after another
(`batches`: light interpreters and Node five at a time, Chromium two, the locked
environments alone or in pairs): a scenario's clients start at once, and a dozen
interpreters importing litellm, LangChain or Chromium side by side on a small machine would
eat the scenarios' client bounds and turn slow imports into hangs. `--update` keeps the
columns of clients not named, and the rows of scenarios not run, from the last run's
matrix.json (refresh one library, or one scenario's row); a column keeps its own date
unless every row it holds was run again, and says how many were and when (`column_ran`). Before a
client runs, its environment is prepared outside every bound (`BUILTIN_CLIENTS[name]`
builds a locked Python environment, the Node launcher's `ready` runs `npm ci`).

The result is plain data (`matrix.json`: clients with library versions and defaults, one
cell per scenario and client) rendered by `middlebox.report.compatibility` into
docs/compatibility.md. The agent clients (`SCENARIO_CLIENTS`) are left out: they are scored
only in the scenarios that name them.

    python -m middlebox.run.matrix [SCENARIOS...] [--client NAME ...] [--jobs N] [--update]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import middlebox
from middlebox import clients as registry
from middlebox.clients import envs
from middlebox.clients.facts import CLIENT_FACTS, ClientFacts
from middlebox.report.compatibility import compatibility_markdown
from middlebox.report.scorecard import cell
from middlebox.run.suite import run_suite

NODE_PACKAGE = Path(registry.__file__).resolve().parent / "node" / "package.json"


def matrix_clients() -> list[str]:
    """Every built-in client this machine can run, but the agent clients."""
    agents = set(getattr(registry, "SCENARIO_CLIENTS", ()))
    return [name for name in registry.available_clients(every=True) if name not in agents]


# Clients that share one run (their processes start side by side in each scenario), by
# runtime: light interpreters and Node together, Chromium two at a time, and each locked
# environment alone or in pairs, as imports of tens of seconds on a loaded machine would
# otherwise eat the client bound.
BATCH_SIZE = {"python": 5, "node": 5, "chromium": 2, "python-env": 2}
# imports of 4-15 s here (the Agents SDK's 4-5 s): never beside another
ALONE = {"litellm", "langchain-openai", "openai-agents"}


def _runtime(name: str) -> str:
    facts = CLIENT_FACTS.get(name)
    return facts.runtime if facts is not None else "?"


def batches(names: Sequence[str]) -> list[list[str]]:
    """The clients in order, consecutive ones of a runtime grouped up to its batch size."""
    groups: list[list[str]] = []
    for name in names:
        last = groups[-1] if groups else []
        if (
            last
            and name not in ALONE
            and last[0] not in ALONE
            and _runtime(last[0]) == _runtime(name)
            and len(last) < BATCH_SIZE.get(_runtime(name), 1)
        ):
            last.append(name)
        else:
            groups.append([name])
    return groups


def node_clients() -> set[str]:
    return set(getattr(registry, "NODE_CLIENTS", {}))


def _command_version(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return "?"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return "?"
    words = out.stdout.split()
    return next((w.lstrip("v") for w in words if w[:1].isdigit() or w[:2] == "v2"), "?")


def client_version(name: str, facts: ClientFacts) -> str:
    """The version of the library `name` drives, as installed or pinned for it."""
    if name in envs.LOCKED_CLIENTS:
        return envs.library_version(name)
    if name in node_clients():
        pinned = json.loads(NODE_PACKAGE.read_text()).get("dependencies", {})
        if facts.library in pinned:
            return str(pinned[facts.library])
        return "node " + _command_version(["node", "--version"])
    if facts.runtime == "chromium":
        chromium = registry.chromium_path()
        return _command_version([chromium, "--version"]) if chromium else "?"
    if not facts.library:
        return f"middlebox {middlebox.__version__}"
    try:
        return importlib.metadata.version(facts.library)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def prepare(name: str) -> None:
    """Build the client's environment now, outside every scenario's bound."""
    registry.BUILTIN_CLIENTS[name]  # a locked client's environment is built by the lookup
    if name in node_clients():
        from middlebox.clients.node import launch

        launch.ready()


def client_row(name: str, ran: str = "") -> dict[str, Any]:
    """The client's library, version and defaults; `ran` says when its column was measured
    (an --update keeps older columns, so the page says which run each came from)."""
    facts = CLIENT_FACTS.get(name, ClientFacts("?", "?", "?", "?", "?"))
    return {
        "name": name,
        "ran": ran,
        "library": facts.library,
        "version": client_version(name, facts),
        "runtime": facts.runtime,
        "timeout": facts.timeout,
        "retries": facts.retries,
        "resume": facts.resume,
        "fixes": dict(facts.fixes),
    }


def cells_of(document: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """scenario -> this client's cell, from one run's report document."""
    cells: dict[str, dict[str, Any]] = {}
    for scenario in document["scenarios"]:
        found = [r for r in scenario.get("results", []) if r["client"] == name]
        if not found:
            status = scenario.get("status") or "not run"
            cells[scenario["name"]] = {"cell": "-", "verdicts": [], "passed": None, "why": status}
            continue
        result = found[0]
        text, _ = cell(result)
        if result["requests"] and all(
            r["verdict"] == "hang" and not r.get("attempts") for r in result["requests"]
        ):
            # no request reached the proxy: the process was still starting (importing its
            # library) when the bound ran out, which says nothing of how the library streams
            text += " (not started)"
        cells[scenario["name"]] = {
            "cell": text,
            "verdicts": [request["verdict"] for request in result["requests"]],
            "passed": result["passed"],
            "why": "",
        }
    return cells


def run_matrix(
    targets: Sequence[str],
    names: Sequence[str],
    *,
    jobs: int,
    report_dir: Path,
    on_client: Callable[[dict[str, Any]], None] = lambda matrix: None,
    earlier: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every scenario for each batch of clients in turn; the matrix as plain data,
    handed to `on_client` after each batch too (a long run leaves its table so far).
    `earlier` (a previous matrix) keeps the columns of clients not run now."""
    rows: list[dict[str, Any]] = []
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    scenarios: list[str] = []
    earlier_cells: dict[str, dict[str, dict[str, Any]]] = {}
    earlier_ran: dict[str, str] = {}
    if earlier is not None:
        earlier_cells = earlier["cells"]
        earlier_ran = {row["name"]: row.get("ran", "") for row in earlier["clients"]}
        rows = [row for row in earlier["clients"] if row["name"] not in names]
        cells = {row["name"]: earlier["cells"][row["name"]] for row in rows}
        scenarios = list(earlier["scenarios"])
    groups = batches(names)
    for number, group in enumerate(groups, start=1):
        print(f"matrix: [{number}/{len(groups)}] {', '.join(group)}", file=sys.stderr, flush=True)
        for name in group:
            prepare(name)
        started = datetime.datetime.now(datetime.UTC)
        # No report_dir: the full reports draw a timeline PNG per scenario and client,
        # minutes per batch on a loaded machine for a page the matrix does not need; the
        # batch's report.json is kept (journals stay in the run's scratch folder).
        document = run_suite(targets, client_names=group, jobs=jobs).document()
        batch_dir = report_dir / "-".join(group)
        batch_dir.mkdir(parents=True, exist_ok=True)
        (batch_dir / "report.json").write_text(json.dumps(document, indent=1))
        for scenario in document["scenarios"]:
            if scenario["name"] not in scenarios:
                scenarios.append(scenario["name"])
        ran = f"{started:%Y-%m-%d %H:%M}-{datetime.datetime.now(datetime.UTC):%H:%M} UTC"
        for name in group:
            # an update over some scenarios keeps the client's other rows, and their date
            before, fresh = earlier_cells.get(name, {}), cells_of(document, name)
            cells[name] = {**before, **fresh}
            rows.append(client_row(name, column_ran(earlier_ran.get(name, ""), before, fresh, ran)))
        on_client(matrix_document(targets, jobs, rows, scenarios, cells))
    return matrix_document(targets, jobs, rows, scenarios, cells)


def column_ran(earlier: str, before: dict[str, Any], fresh: dict[str, Any], ran: str) -> str:
    """When a client's column was measured: `ran` (this run) when this run measured every
    row the column holds; otherwise the column's own date (`earlier`), with the rows this
    run measured and when."""
    if all(scenario in fresh for scenario in before):
        return ran
    rows = len(before.keys() | fresh.keys())
    return f"{earlier or '?'}; {len(fresh)} of {rows} rows {ran}"


def matrix_document(
    targets: Sequence[str],
    jobs: int,
    rows: list[dict[str, Any]],
    scenarios: list[str],
    cells: dict[str, dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    return {
        "generated": datetime.date.today().isoformat(),
        "middlebox": middlebox.__version__,
        "python": platform.python_version(),
        "command": " ".join(["python -m middlebox.run.matrix", *targets, f"--jobs {jobs}"]),
        "clients": list(rows),
        "scenarios": list(scenarios),
        "cells": dict(cells),
    }


def write_matrix(matrix: dict[str, Any], out: Path, report_dir: Path) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "matrix.json").write_text(json.dumps(matrix, indent=1))
    out.write_text(compatibility_markdown(matrix))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m middlebox.run.matrix",
        description="Every scenario against every client: writes docs/compatibility.md.",
    )
    parser.add_argument("targets", nargs="*", help="scenarios (default: the whole library)")
    parser.add_argument("--client", action="append", dest="clients", help="only these")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios run at once")
    parser.add_argument("--out", default="docs/compatibility.md")
    parser.add_argument("--report", default="reports/matrix", help="reports and matrix.json")
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep the other clients' columns from the report folder's matrix.json",
    )
    args = parser.parse_args(argv)
    names = args.clients or matrix_clients()
    unknown = [name for name in names if name not in registry.BUILTIN_CLIENTS]
    if unknown:
        parser.error(f"unknown client(s): {', '.join(unknown)}")
    report_dir = Path(args.report)
    out = Path(args.out)
    earlier_file = report_dir / "matrix.json"
    earlier = (
        json.loads(earlier_file.read_text()) if args.update and earlier_file.exists() else None
    )
    matrix = run_matrix(
        args.targets,
        names,
        jobs=args.jobs,
        report_dir=report_dir,
        on_client=lambda so_far: write_matrix(so_far, out, report_dir),
        earlier=earlier,
    )
    write_matrix(matrix, out, report_dir)
    failed = [
        f"{scenario}/{name}"
        for name, column in matrix["cells"].items()
        for scenario, entry in column.items()
        if entry.get("passed") is False
    ]
    print(f"matrix: wrote {args.out} and {report_dir / 'matrix.json'}", file=sys.stderr)
    if failed:
        print(f"matrix: expectations failed in {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
