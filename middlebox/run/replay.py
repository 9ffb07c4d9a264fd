"""`middlebox replay report.json`: rerun a report's scenarios with its seeds and clients and
list every verdict that differs, and every request whose generated or shown text differs
(the report's `run` section holds what a rerun needs; the emulator is seeded by the same
seed, so the same seed must give the same text, not only the same verdicts). A file that
is no report is a UsageError saying what `replay` expects; the scenarios are found where
`scenario_paths` looks (a report moved to another folder or machine still replays).

One difference is the run's timing rather than its seed, and is listed apart as a note:
shown text that differs where the upstream split the same text into other events (a
lagging writer merges tokens, in vLLM and the emulator alike, so a fault counting events
or tokens cuts elsewhere). Both reports must carry the split (`upstream_split`), and it
must differ in the events both runs had (an upstream reset a moment later sends a few more
after the cut: the same split); otherwise a shown text that differs is a difference."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from middlebox.library import scenario_file
from middlebox.report.scorecard import verdict_sections
from middlebox.run.outcome import RunError, SuiteOutcome, UsageError, report_document
from middlebox.run.suite import run_suite

EXPECTED = "expected the report.json that `middlebox run --report DIR` writes"


@dataclass
class Replay:
    suite: SuiteOutcome
    differences: list[str]
    # shown text that differs where the upstream's events did too (`compare_texts`)
    notes: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.differences


def replay_report(report_path: Path, report_dir: Path | None) -> Replay:
    """Rerun a report's scenarios with its seeds and clients; list verdicts that differ."""
    document = read_report(report_path)
    run = document["run"]
    suite = run_suite(
        scenario_paths(run["paths"], report_path),
        client_names=run.get("clients") or (),
        client_commands=run.get("client_commands") or (),
        seed=run.get("seed"),
        upstream_url=run.get("upstream"),
        report_dir=report_dir,
        jobs=run.get("jobs", 2),
    )
    before = verdict_sections(document)
    after = verdict_sections(report_document(suite, run))
    differences = []
    for scenario in sorted(before.keys() | after.keys()):
        for client in sorted(before.get(scenario, {}).keys() | after.get(scenario, {}).keys()):
            old = before.get(scenario, {}).get(client)
            new = after.get(scenario, {}).get(client)
            if old != new:
                differences.append(f"{scenario}/{client}: was {old}, now {new}")
    texts = compare_texts(document, report_document(suite, run))
    return Replay(suite, differences + texts.differences, texts.notes)


def read_report(path: Path) -> dict[str, Any]:
    """A report's document, or a UsageError saying what the file is instead."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"{path}: cannot read it ({error.strerror})") from None
    except ValueError as error:  # not JSON, or not UTF-8
        raise UsageError(f"{path}: not JSON ({error}); {EXPECTED}") from None
    run = document.get("run") if isinstance(document, dict) else None
    if not isinstance(run, dict) or not isinstance(run.get("paths"), list):
        raise UsageError(
            f"{path}: JSON without a report's `run` section (the scenarios, seed and clients "
            f"to rerun); {EXPECTED}"
        )
    return dict(document)


def scenario_paths(recorded: list[Any], report_path: Path) -> list[str]:
    """Where a report's scenarios are here. A library scenario's name is taken as it is; a
    file as recorded when it is there, else (a report that recorded a path relative to
    where its run started, replayed from elsewhere) under the report's folder or the folder
    above it (`--report out/` from where the run started), and a library file of another
    install by its name. A RunError names the first found nowhere."""
    folder = report_path.absolute().parent
    found = []
    for entry in map(str, recorded):
        path = Path(entry)
        if not path.suffix and scenario_file(entry) is not None:
            found.append(entry)
            continue
        candidates = [path] if path.is_absolute() else [path, folder / path, folder.parent / path]
        here = next((str(c) for c in candidates if c.is_file()), None)
        library = path.parent.parts[-2:] == ("library", "scenarios")
        if here is None and library and scenario_file(path.name) is not None:
            here = path.stem
        if here is None:
            raise RunError(
                f"{report_path}: scenario {entry} not found (looked as written, beside the "
                "report and in the folder above it)"
            )
        found.append(here)
    return found


Texts = tuple[str, str, list[int]]


def request_texts(document: dict[str, Any]) -> dict[tuple[str, str, int], Texts]:
    """Per (scenario, client, request index): digests of the text the upstream generated
    (what the client should have shown) and of the text the client showed, and how the
    upstream split it into events (empty in a report written before it was kept)."""
    return {
        (scenario["name"], result["client"], int(request["index"])): (
            str(request.get("expected_digest", "")),
            str(request.get("shown_digest", "")),
            [
                int(size)
                for size in str(request.get("upstream_split") or "").split(",")
                if size.isdigit()
            ],
        )
        for scenario in document.get("scenarios", [])
        for result in scenario.get("results", [])
        for request in result.get("requests", [])
    }


def split_otherwise(before: list[int], after: list[int]) -> bool:
    """Whether the upstream split the text into other events in the two runs: an event
    both runs had added text of another length. Extra events in one run alone (the
    upstream heard a reset later) are not another split; no split known is none."""
    return any(old != new for old, new in zip(before, after, strict=False))


class TextComparison(NamedTuple):
    """What `replay` finds in two reports' texts: `differences` fail it; `notes` are
    shown text that differs where the upstream split the same text into other events
    (the run's timing, not its seed)."""

    differences: list[str]
    notes: list[str]


def compare_texts(before: dict[str, Any], after: dict[str, Any]) -> TextComparison:
    """Requests present in both reports: a generated text that changed, or a shown text
    that changed while the upstream split the text into the same events, is a difference;
    a shown text that changed where the split did too is a note."""
    old, new = request_texts(before), request_texts(after)
    found = TextComparison([], [])
    # a report written before the digests existed has none to compare
    for key in sorted(k for k in old.keys() & new.keys() if old[k][0] and new[k][0]):
        (old_expected, old_shown, old_split), (new_expected, new_shown, new_split) = (
            old[key],
            new[key],
        )
        scenario, client, index = key
        where = f"{scenario}/{client}: request {index}"
        if old_expected != new_expected:
            found.differences.append(f"{where}: generated text differs")
        elif old_shown != new_shown and split_otherwise(old_split, new_split):
            found.notes.append(
                f"{where}: shown text differs, and the upstream split the same text into other"
                " events (its writer lagged and merged tokens: the run's timing, not its seed)"
            )
        elif old_shown != new_shown:
            found.differences.append(f"{where}: shown text differs")
    return found
