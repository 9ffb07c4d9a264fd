"""`python -m bench`: run the suite, write bench/results.json, regenerate docs/performance.md.

`--quick` runs small counts and short windows for iterating on the harness itself; its
results go to a file in the temporary directory and leave the repository alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.render import update_document
from bench.suite import Settings, run_suite

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts, short windows")
    parser.add_argument(
        "--streams",
        help="comma-separated stream counts, e.g. 250,500,750 (a partial run: no ladder, "
        "no bulk, results in the temporary directory)",
    )
    parser.add_argument("--paths", help="comma-separated path names for a partial run")
    parser.add_argument(
        "--bulk",
        action="store_true",
        help="a partial run also measures bulk transfers and connection setup on its paths "
        "(`--streams ''` for those alone)",
    )
    args = parser.parse_args()
    settings = Settings()
    partial = args.streams is not None or bool(args.paths)
    if partial:
        settings = Settings(
            streams=(
                tuple(int(n) for n in args.streams.split(",") if n)
                if args.streams is not None
                else (100,)
            ),
            ladder=(),
            only_paths=tuple(args.paths.split(",")) if args.paths else (),
            bulk=args.bulk,
        )
    if args.quick:
        settings = Settings(
            warmup_s=0.5,
            measure_s=1.0,
            bulk_s=0.5,
            connect_s=0.5,
            big_bytes=64 << 20,
            streams=(1, 100),
            ladder=(300,),
        )

    def log(line: str) -> None:
        print(line, flush=True)

    results = run_suite(settings, log)
    out = (
        Path(tempfile.gettempdir()) / "middlebox-bench-quick.json"
        if args.quick or partial
        else HERE / "results.json"
    )
    out.write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {out} in {results['duration_s']} s")
    if not (args.quick or partial):
        doc = HERE.parent / "docs" / "performance.md"
        update_document(doc, results)
        log(f"updated {doc}")
    for target in results["targets"]:
        log(f"{'met ' if target['met'] else 'MISS'} {target['target']}: {target['measured']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
