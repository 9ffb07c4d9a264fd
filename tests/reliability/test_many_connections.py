"""The acceptance run's journal check (tests/reliability/many_connections.py) on journals
written by hand: what it counts as complete, missing, and the SIGKILL's last second."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from tests.reliability.many_connections import ANSWER, GET, check_journal


def connection_lines(cid: int, number: int, answered: bool = True) -> list[dict[str, object]]:
    def captured(direction: str, data: bytes) -> dict[str, object]:
        encoded = base64.b64encode(data).decode()
        return {"connection": cid, "type": "bytes", "leg": "client", "direction": direction,
                "base64": encoded}  # fmt: skip

    return [
        {"connection": cid, "type": "open", "time": 1.0},
        captured("upstream", GET.format(number).encode()),
        captured("downstream", ANSWER if answered else ANSWER[:20]),
        {"connection": cid, "type": "summary"},
    ]


def write(path: Path, lines: list[dict[str, object]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + tail)
    return path


def test_a_full_run_needs_ids_1_to_n_each_complete(tmp_path: Path) -> None:
    lines = [line for cid in (1, 2, 3) for line in connection_lines(cid, 4 - cid)]
    totals = {"type": "journal", "connections": 3, "dropped_lines": 0}
    journal = write(tmp_path / "j.ndjson", [*lines, totals])
    result = check_journal(journal, {1: 0.0, 2: 0.0, 3: 0.0}, killed_at=0.0)
    assert result["connections_complete"] == 3 and result["missing_count"] == 0
    assert result["totals"] == totals
    # a connection whose answer is cut, and one the client finished but the journal lacks
    lines = connection_lines(1, 1) + connection_lines(2, 2, answered=False)
    result = check_journal(write(tmp_path / "k.ndjson", lines), {1: 0, 2: 0, 3: 0}, 0.0)
    assert result["finished_at_client_missing"] == [2, 3]
    assert result["summaries_without_answer"] == 1 and result["missing_count"] > 0


def test_after_a_sigkill_only_the_last_second_may_be_missing(tmp_path: Path) -> None:
    lines = [*connection_lines(1, 1), {"connection": 2, "type": "open", "time": 1.0}]
    journal = write(tmp_path / "j.ndjson", lines, tail='{"connection": 2, "ty')
    killed_at = 100.0
    # request 2 finished 0.4 s before the kill: the open connections' tail
    result = check_journal(journal, {1: 90.0, 2: 99.6}, killed_at)
    assert result["cut_last_line"] and result["open_without_summary"] == 1
    assert result["finished_in_the_last_second"] == 1 and result["of_which_missing"] == 1
    assert result["missing_count"] == 0
    # finished 3 s before the kill and still missing: a lost connection
    result = check_journal(journal, {1: 90.0, 2: 97.0}, killed_at)
    assert result["finished_at_client_missing"] == [2] and result["missing_count"] == 1
