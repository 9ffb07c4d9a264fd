"""Training drills: an incident to diagnose with middlebox, graded by running it.

A drill (`middlebox/library/drills/NAME.yaml`, shipped in the package) has symptoms as a
user would report them, a hidden scenario (drawn from the scenario library; `library:`
names the library scenario it comes from), progressive hints whose last one reveals the
fault and the fix, and a check: the `expect:` rules the fixed system must meet. Drills
are self-contained, so a change to the library does not change a drill's grade.

- `middlebox drill list`: the drills, with whether the fix is in the client or in the
  proxy/server configuration;
- `middlebox drill start NAME [--port P] [--control-port C] [--journal FILE]`: prints
  the symptoms and runs the emulator and `middlebox proxy` with the hidden fault and its
  control API, so the trainee can reproduce it with their own client or curl, inspect
  `/metrics` and the journals (`/journals/ID`) on the control port while it runs; on
  Ctrl-C every connection's journal is written to FILE (NDJSON, the hints' "journal").
  The proxy's live console (`--ui`, docs/ui.md) is on unless `--no-ui`: the streams as
  they flow, the symptoms, the hints one at a time and the latest `drill check` grade
  (`console_state`, read from the file `check` writes: `result_path`);
- `middlebox drill hint NAME N`: hint N (1-based);
- `middlebox drill check NAME --client-cmd CMD [--scenario FIXED.yaml]`: runs the
  drill's scenario (or the trainee's fixed copy, which must keep the drill's
  `keep_faults`: the network does not change) with the trainee's client through
  `middlebox.run.suite.run_suite`, and passes when every check holds. That a fault no
  longer fires is allowed here (a fix may avoid it); that no traffic reached the
  proxy is not.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from middlebox.clients.places import cache_root
from middlebox.library import drill_dir

DRILLS_DIR = drill_dir()


class DrillError(Exception):
    """An unknown drill, a bad hint number, a fix that changed what it must keep, or an
    incident that could not start."""


# `drill start`'s options for the listeners of the proxy it runs. The proxy's start-up
# error names its own options (`cannot listen on ADDRESS (--control): ...`), which the
# drill's user never typed.
LISTENER_OPTIONS = {"--listen": "--port", "--control": "--control-port", "--ui": "--ui-port"}


def in_drill_terms(proxy_error: str) -> str:
    """A proxy's start-up error with its listener options named as `drill start` has them."""
    for proxy_option, drill_option in LISTENER_OPTIONS.items():
        proxy_error = proxy_error.replace(f"({proxy_option})", f"({drill_option})")
    return proxy_error


@dataclass
class Drill:
    name: str
    title: str
    symptoms: str
    hints: list[str]
    scenario: dict[str, Any]
    expect: dict[str, Any]
    fix: str = "client"
    library: str = ""
    keep_faults: list[str] = field(default_factory=list)

    def scenario_document(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        """The scenario to run: the hidden one (or the trainee's), with the drill's checks."""
        document = dict(base if base is not None else self.scenario)
        document.setdefault("name", f"drill-{self.name}")
        document.setdefault("description", f"training drill {self.name}: {self.title}")
        document["expect"] = self.expect
        return document


def load_drill(path: Path) -> Drill:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    check = data.get("check") or {}
    return Drill(
        name=str(data["name"]),
        title=str(data["title"]),
        symptoms=str(data["symptoms"]).strip(),
        hints=[str(hint).strip() for hint in data.get("hints") or []],
        scenario=dict(data["scenario"]),
        expect=dict(check.get("expect") or {}),
        fix=str(data.get("fix", "client")),
        library=str(data.get("library", "")),
        keep_faults=list(check.get("keep_faults") or []),
    )


def all_drills(directory: Path = DRILLS_DIR) -> dict[str, Drill]:
    drills = {}
    for path in sorted(directory.glob("*.yaml")):
        drill = load_drill(path)
        drills[drill.name] = drill
    return drills


def get(name: str, directory: Path = DRILLS_DIR) -> Drill:
    drills = all_drills(directory)
    if name not in drills:
        raise DrillError(f"no drill {name!r}; drills: {', '.join(drills)}")
    return drills[name]


def hint(name: str, number: int, directory: Path = DRILLS_DIR) -> str:
    drill = get(name, directory)
    if not 1 <= number <= len(drill.hints):
        raise DrillError(f"drill {name!r} has hints 1 to {len(drill.hints)}")
    return drill.hints[number - 1]


def listing(directory: Path = DRILLS_DIR) -> str:
    rows = [
        f"{drill.name:<24} {drill.title}  [fix: {drill.fix}, {len(drill.hints)} hints]"
        for drill in all_drills(directory).values()
    ]
    return "\n".join(rows)


def briefing(drill: Drill) -> str:
    return (
        f"Drill {drill.name}: {drill.title}\n\nSymptoms:\n{drill.symptoms}\n\n"
        f"Where the fix goes: {drill.fix}. Hints: `middlebox drill hint {drill.name} 1` "
        f"to {len(drill.hints)}.\nGrade your fix: `middlebox drill check {drill.name} "
        f"--client-cmd 'python my_client.py'`"
        + (" --scenario fixed.yaml" if drill.fix != "client" else "")
    )


def write_scenario(drill: Drill, directory: Path, fixed: Path | None = None) -> Path:
    """The scenario file a check runs; a trainee's fix must keep `keep_faults`."""
    base = None
    if fixed is not None:
        base = yaml.safe_load(fixed.read_text(encoding="utf-8")) or {}
        if not isinstance(base, dict):
            raise DrillError(f"{fixed}: expected a scenario (a YAML mapping)")
        names = [
            next(iter(entry)) if isinstance(entry, dict) else str(entry)
            for entry in base.get("path") or []
        ]
        missing = [name for name in drill.keep_faults if name not in names]
        if missing:
            raise DrillError(
                f"your scenario removed {', '.join(missing)}: the network is not yours to "
                f"change; fix the server or the client side instead"
            )
    path = directory / f"drill-{drill.name}.yaml"
    path.write_text(yaml.safe_dump(drill.scenario_document(base), sort_keys=False))
    return path


@dataclass
class Grade:
    passed: bool
    reasons: list[str]
    suite: Any


def grade(suite: Any) -> Grade:
    """Pass when every check holds and the client's traffic went through the proxy."""
    reasons = []
    for outcome in suite.outcomes:
        reasons += [p for p in outcome.problems if "never fired for any client" not in p]
        for score in outcome.scores:
            reasons += [
                f"{score.client}: {check.describe()}" for check in score.checks if not check.passed
            ]
    return Grade(not reasons, reasons, suite)


def check(
    name: str,
    client_commands: list[str],
    *,
    fixed_scenario: Path | None = None,
    report_dir: Path | None = None,
    directory: Path = DRILLS_DIR,
) -> Grade:
    """Run the drill against the trainee's client (and fixed scenario) and grade it."""
    from middlebox.run.suite import run_suite

    drill = get(name, directory)
    if not client_commands:
        raise DrillError("give your client with --client-cmd 'COMMAND'")
    with tempfile.TemporaryDirectory(prefix="middlebox-drill-") as scratch:
        path = write_scenario(drill, Path(scratch), fixed_scenario)
        suite = run_suite(
            [str(path)], client_commands=client_commands, report_dir=report_dir, jobs=1
        )
    graded = grade(suite)
    save_result(drill.name, graded.passed, graded.reasons)
    return graded


def result_path(name: str) -> Path:
    """Where `drill check NAME` leaves its grade for a running `drill start`'s console."""
    return cache_root() / "drills" / f"{name}.check.json"


def save_result(name: str, passed: bool, reasons: list[str]) -> None:
    """The grade, written aside and renamed (a console reading it sees all or nothing)."""
    path = result_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    aside.write_text(json.dumps({"passed": passed, "reasons": reasons, "at": time.time()}))
    aside.replace(path)


def console_state(name: str, directory: Path = DRILLS_DIR) -> Callable[[], dict[str, Any]]:
    """What the console shows of drill `name`: its title, symptoms (one a line), hints and
    the grade of a `drill check` run since the console started (re-read when the file
    changes; a grade from an earlier session is not this trainee's)."""
    drill = get(name, directory)
    started = time.time()
    seen: dict[str, Any] = {"mtime": None, "check": None}
    state = {
        "name": drill.name,
        "title": drill.title,
        "fix": drill.fix,
        "symptoms": [" ".join(p.split()) for p in drill.symptoms.split("\n\n") if p.strip()],
        "hints": drill.hints,
    }

    def current() -> dict[str, Any]:
        path = result_path(name)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = None
        if mtime != seen["mtime"]:
            seen["mtime"] = mtime
            try:
                result = json.loads(path.read_text()) if mtime is not None else None
            except (OSError, ValueError):
                result = None
            seen["check"] = (
                None
                if not result or float(result.get("at", 0)) < started
                else ("PASS" if result.get("passed") else "FAIL: " + "; ".join(result["reasons"]))
            )
        return {**state, "check": seen["check"]}

    return current


@dataclass
class LiveDrill:
    """A drill's incident running: the emulator and the proxy (with its control API)."""

    drill: Drill
    emulator: Any
    proxy: Any  # middlebox.run.live.ProxyProcess
    model: str
    journal: Path

    def stop(self) -> None:
        """Stop the proxy (it writes the journal as it stops), then the emulator."""
        try:
            self.proxy.stop()
        finally:
            self.emulator.stop()


def start(
    name: str,
    directory: Path = DRILLS_DIR,
    *,
    port: int = 0,
    control_port: int = 0,
    journal: Path | None = None,
    ui_port: int | None = 0,
) -> LiveDrill:
    """Start the emulator (the drill's `upstream:` block) and `middlebox proxy` with the
    drill's hidden scenario, a control API and (unless `ui_port` is None) the live console
    on 127.0.0.1 (port 0: a free one)."""
    from middlebox.compose import load
    from middlebox.run.live import start_proxy
    from middlebox.run.processes import EmulatorProcess, UpstreamStartError, emulator_config
    from middlebox.run.upstream import UpstreamClient

    drill = get(name, directory)
    scratch = Path(tempfile.mkdtemp(prefix="middlebox-drill-"))
    path = write_scenario(drill, scratch)
    scenario = load(path)
    journal = journal if journal is not None else scratch / f"drill-{drill.name}.journal.ndjson"
    emulator = EmulatorProcess(emulator_config(scenario, scenario.seed), scratch)
    try:
        proxy = start_proxy(
            emulator.url,
            scenario=path,
            listen=f"127.0.0.1:{port}",
            control=f"127.0.0.1:{control_port}",
            journal=journal,
            ui=None if ui_port is None else f"127.0.0.1:{ui_port}",
            drill=drill.name,
        )
    except UpstreamStartError as error:
        emulator.stop()
        raise DrillError(in_drill_terms(str(error))) from None
    except BaseException:
        emulator.stop()
        raise
    try:
        model = UpstreamClient(emulator.url).model()
    except BaseException:
        LiveDrill(drill, emulator, proxy, "", journal).stop()
        raise
    return LiveDrill(drill, emulator, proxy, model, journal)


def live_banner(live: LiveDrill) -> str:
    """Where the incident is and where to look (the hints name the journal)."""
    control = live.proxy.control.url
    console = (
        f"Console: {live.proxy.ui_url} (the streams as they flow, the symptoms, the hints "
        "one at a time, your `drill check` grade).\n"
        if live.proxy.ui_url
        else ""
    )
    return (
        f"\nThe incident is live: OPENAI_BASE_URL={live.proxy.base_url} "
        f"(model {live.model}).\n{console}"
        f"Control API: {control}/metrics, {control}/journals, {control}/journals/ID "
        f"(one connection's journal, NDJSON).\n"
        f"Every connection's journal is written to {live.journal} when you stop "
        f"(`middlebox pcap {live.journal} -o drill.pcapng` for Wireshark). Ctrl-C to stop."
    )


def run_live(
    name: str,
    say: Callable[[str], None],
    directory: Path = DRILLS_DIR,
    *,
    port: int = 0,
    control_port: int = 0,
    journal: Path | None = None,
    ui_port: int | None = 0,
) -> str:
    """`drill start`: the briefing, then the incident (emulator + proxy) live until Ctrl-C;
    returns the closing line."""
    live = start(
        name, directory, port=port, control_port=control_port, journal=journal, ui_port=ui_port
    )
    connections = 0
    try:  # from the first line on, so a Ctrl-C as soon as it shows still stops cleanly
        say(briefing(live.drill))
        say(live_banner(live))
        while live.proxy.process.running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            connections = int(live.proxy.control.counters()["middlebox_connections_total"])
        except Exception:  # the proxy already gone: its count went with it
            pass
        live.stop()
    return f"\nstopped after {connections} connections; journal: {live.journal}"
