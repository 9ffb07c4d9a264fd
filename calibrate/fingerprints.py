"""`python -m calibrate.fingerprints [NAME ...]`: `middlebox fingerprint URL --write PATH
--verify` through real proxies that no preset models (docs/fingerprint.md, "More proxies").

Each run starts a probe upstream and one real proxy in front of it on loopback (Debian's
package, a minimal config from `calibrate.proxies`: its defaults, or one non-default
buffering or timeout setting), fingerprints the proxy, writes the fitted scenario and plays
the same measures through `middlebox proxy` with it. Everything the command prints is
printed here under the run's name; `--out` keeps each run's scenario (`NAME.yaml`) and its
fingerprint document (`NAME.json`). Never part of the test suite (apt-get needs root; the
six runs take about 4 minutes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from calibrate import proxies
from middlebox.tools.fingerprint import FingerprintError, fingerprint_and_fit, write_json
from middlebox.tools.probe_upstream import ProbeUpstream

ROOT = Path(__file__).resolve().parent.parent

# One run each: the proxy as configured by its defaults, then one setting changed.
RUNS: dict[str, proxies.Setup] = {
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


def run_one(name: str, setup: proxies.Setup, out: Path, budget: float, work: Path) -> None:
    """Fingerprint, fit and verify one proxy setup; print it all, keep NAME.yaml and
    NAME.json in `out`."""
    print(f"## {name}: {proxies.version(setup.software)}", flush=True)
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        proxies.running(setup, probe.port, work / name) as port,
    ):
        document = fingerprint_and_fit(
            f"http://127.0.0.1:{port}/v1", direct=None, budget=budget,
            scenario=out / f"{name}.yaml", verify=True,
            progress=lambda line: print(f"  .. {line}", file=sys.stderr, flush=True),
            say=lambda line: print(line, flush=True),
        )  # fmt: skip
    write_json(document, out / f"{name}.json")
    print(f"\n{(out / f'{name}.yaml').read_text()}", flush=True)


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
    if not args.no_install:
        proxies.ensure_installed(proxies.MORE_PACKAGES)
    names = args.names or list(RUNS)
    missing = sorted({proxies.MORE_PACKAGES[RUNS[n].software] for n in names
                      if not proxies.binary(RUNS[n].software)})  # fmt: skip
    if missing:
        print(f"calibrate.fingerprints: missing {missing}; install the Debian packages",
              file=sys.stderr)  # fmt: skip
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fingerprints-") as tmp:
        for name in names:
            try:
                run_one(name, RUNS[name], args.out, args.budget, Path(tmp))
            except FingerprintError as error:
                print(f"calibrate.fingerprints: {name}: {error}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
