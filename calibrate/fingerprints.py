"""`python -m calibrate.fingerprints [NAME ...]`: `middlebox fingerprint URL --write PATH
--verify` through the real proxy of each preset, started as `make calibrate` starts it
(docs/fingerprint.md, "Presets against their real proxies"), and through real proxies that
no preset models ("More proxies").

Each run starts a probe upstream and one real proxy in front of it on loopback (Debian's
package, a minimal config from `calibrate.proxies`: its defaults, or one non-default
buffering or timeout setting), fingerprints the proxy, writes the fitted scenario and plays
the same measures through `middlebox proxy` with it. A preset's run then plays them through
`middlebox proxy` with the preset (`- preset: NAME`) the same way, so the two agreements
and the closest preset named end the run (and the table printed last). Everything the
command prints is printed here under the run's name; `--out` keeps each run's scenario
(`NAME.yaml`), a preset's (`NAME.preset.yaml`) and the fingerprint document (`NAME.json`,
the preset's agreement under `preset_verify`). Never part of the test suite (apt-get needs
root; the twelve runs take about 8 minutes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from calibrate import proxies
from calibrate.suite import REAL
from middlebox.scenario import fit
from middlebox.tools.fingerprint import (
    FingerprintError,
    fingerprint_and_fit,
    verify_scenario,
    write_json,
)
from middlebox.tools.probe_upstream import ProbeUpstream

ROOT = Path(__file__).resolve().parent.parent

# A preset's run: its real proxy as `make calibrate` starts it for the stream (a preset
# named after it); then the proxies no preset models, one run each as configured by its
# defaults, then one setting changed.
PRESET_RUNS: dict[str, proxies.Setup] = dict(REAL)
RUNS: dict[str, proxies.Setup] = {
    **PRESET_RUNS,
    "lighttpd-default": proxies.Setup("lighttpd"),
    # server.stream-response-body = 2
    "lighttpd-streaming": proxies.Setup("lighttpd", buffering=False),
    "varnish-default": proxies.Setup("varnishd"),
    # the backend's .between_bytes_timeout = 1s
    "varnish-between-bytes-1s": proxies.Setup("varnishd", read_timeout=1.0),
    "squid-default": proxies.Setup("squid"),
    # read_timeout 1 seconds
    "squid-read-timeout-1s": proxies.Setup("squid", read_timeout=1.0),
}


def _progress(line: str) -> None:
    print(f"  .. {line}", file=sys.stderr, flush=True)


def run_one(name: str, setup: proxies.Setup, out: Path, budget: float, work: Path) -> str:
    """Fingerprint, fit and verify one proxy setup, and a preset's run its preset too;
    print it all, keep NAME.yaml (NAME.preset.yaml) and NAME.json in `out`; the run's row
    of the closing table."""
    print(f"## {name}: {proxies.version(setup.software)}", flush=True)
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        proxies.running(setup, probe.port, work / name) as port,
    ):
        document = fingerprint_and_fit(
            f"http://127.0.0.1:{port}/v1", direct=None, budget=budget,
            scenario=out / f"{name}.yaml", verify=True, progress=_progress,
            say=lambda line: print(line, flush=True),
        )  # fmt: skip
    preset = ""
    if name in PRESET_RUNS:
        preset = verify_preset(document, name, out, budget)
    write_json(document, out / f"{name}.json")
    print(f"\n{(out / f'{name}.yaml').read_text()}", flush=True)
    return row(name, document, preset)


def preset_scenario(name: str) -> str:
    """A scenario whose path is the preset alone, as a user writes it."""
    return f"name: {name}-preset\npath:\n  - preset: {name}\n"


def verify_preset(document: dict[str, Any], name: str, out: Path, budget: float) -> str:
    """Play the document's measures through `middlebox proxy` with the preset `name` (the
    fitted scenario's verify, with the preset for the scenario); the agreement goes into
    `document` as `preset_verify`; `a of b` for the table."""
    scenario = out / f"{name}.preset.yaml"
    scenario.write_text(preset_scenario(name))
    theirs = dict(document)  # verify_scenario writes its `verify` into the copy
    rows = verify_scenario(theirs, scenario, budget=budget, progress=_progress)
    document["preset_verify"] = theirs["verify"]
    print(f"Verified the preset {name} the same way:", flush=True)
    for line in fit.agreement_lines(rows):
        print(f"  {line}", flush=True)
    if theirs["verify"]["not_played"]:
        skipped = ", ".join(theirs["verify"]["not_played"])
        print(f"  Not measured in the playback (its budget ran out): {skipped}.", flush=True)
    return f"{sum(r.ok for r in rows)} of {len(rows)}"


def _differing(rows: list[dict[str, Any]]) -> str:
    wrong = [r["measure"] for r in rows if not r["ok"]]
    return f" (differs: {', '.join(wrong)})" if wrong else ""


def row(name: str, document: dict[str, Any], preset: str) -> str:
    """The run's line of the closing table: the fitted scenario's agreement, the preset's
    (a preset's run), the closest preset named."""
    verified = document["verify"]
    mine = f"{verified['agreed']} of {verified['of']}{_differing(verified['rows'])}"
    if preset:
        preset += _differing(document["preset_verify"]["rows"])
    closest = document["closest_preset"]
    named = " and ".join(closest["names"]) if closest["names"] else "none"
    if closest["names"] and not closest["agrees"]:
        named = f"nearest {named}{_differing(closest['rows'])}"
    if len(closest["names"]) > 2 and not closest["agrees"]:
        named = "none"
    return f"| {name} | {mine} | {preset or '—'} | {named} |"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrate.fingerprints", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"runs (default: all): {', '.join(RUNS)}")
    parser.add_argument("--budget", type=float, default=16.0, help="each side's budget, s")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "fingerprints")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in RUNS]
    if unknown:
        parser.error(f"unknown run {', '.join(unknown)} (runs: {', '.join(RUNS)})")
    names = args.names or list(RUNS)
    packages = {**proxies.PACKAGES, **proxies.MORE_PACKAGES}
    wanted = {RUNS[n].software: packages[RUNS[n].software] for n in names}
    if not args.no_install:
        proxies.ensure_installed(wanted)
    missing = sorted({package for software, package in wanted.items()
                      if not proxies.binary(software)})  # fmt: skip
    if missing:
        print(f"calibrate.fingerprints: missing {missing}; install the Debian packages",
              file=sys.stderr)  # fmt: skip
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    table = ["| run | fitted scenario agrees | preset agrees | closest preset named |",
             "|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="fingerprints-") as tmp:
        for name in names:
            try:
                table.append(run_one(name, RUNS[name], args.out, args.budget, Path(tmp)))
            except FingerprintError as error:
                print(f"calibrate.fingerprints: {name}: {error}", file=sys.stderr)
                return 1
    print("\n".join(table), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
