"""`middlebox pcap`: a journal becomes TCP packets that read back with the journal's
bytes, sequence numbers, FINs and RSTs (scapy reads the file back; tshark too when it
is installed)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from middlebox.observe.journal import JournalError, read_ndjson
from middlebox.observe.pcap import ISN, CaptureError, write_pcap
from tests.harness import needs
from tests.shell.support import EVENTS, controlled, http

LISTEN, UPSTREAM = 9000, 8000


async def journal_of_a_reset_stream(path: Path) -> None:
    """One request through the proxy; the upstream resets after the first event."""
    assert await journal_of_a_stream(path, "rst") == "rst"


async def journal_of_a_stream(path: Path, end: str = "complete") -> str:
    """One request through the proxy, the upstream ending as `end` says (tests/shell/support
    `sse_upstream`); its journal written to `path`; how the client's side ended."""
    with trio.fail_after(10):
        async with controlled(end=end) as run:
            status, body, ended = await http(run.proxy_port, "POST", "/v1/x", b"{}")
            assert status == 200 and EVENTS[0] in body
            with trio.move_on_after(2):
                while run.proxy.active:
                    await trio.sleep(0.01)
            run.proxy.store.write_ndjson(path)
    return ended


def tcp_packets(pcap: Path) -> list[object]:
    from scapy.layers.inet import TCP
    from scapy.utils import rdpcap

    return [p for p in rdpcap(str(pcap)) if TCP in p]


async def test_an_rst_cut_is_at_the_byte_offset_the_journal_gives(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    from scapy.layers.inet import TCP

    journal = tmp_path / "run.ndjson"
    await journal_of_a_reset_stream(journal)
    pcap = tmp_path / "run.pcapng"
    count = write_pcap(journal, pcap, listen_port=LISTEN, upstream_port=UPSTREAM)
    packets = tcp_packets(pcap)
    assert len(packets) == count
    view = read_ndjson(journal)[0]
    to_client = view.summary["bytes"]["client.downstream"]
    assert to_client == len(view.captured[("client", "downstream")]) > 0
    assert {"leg": "client", "direction": "downstream", "kind": "sent_rst"} in view.summary["ends"]

    proxy_to_client = [p for p in packets if p[TCP].sport == LISTEN]
    rsts = [p for p in proxy_to_client if "R" in str(p[TCP].flags)]
    assert len(rsts) == 1
    assert rsts[0][TCP].seq - ISN["proxy_client"] - 1 == to_client
    # the bytes of the client leg's downstream, reassembled by sequence number
    stream = bytearray(to_client)
    for packet in proxy_to_client:
        payload = bytes(packet[TCP].payload)
        start = packet[TCP].seq - ISN["proxy_client"] - 1
        stream[start : start + len(payload)] = payload
    assert bytes(stream) == view.captured[("client", "downstream")]
    # the upstream's own RST, on the other leg, after what it sent
    from_upstream = [p for p in packets if p[TCP].sport == UPSTREAM]
    upstream_rst = [p for p in from_upstream if "R" in str(p[TCP].flags)]
    assert (
        upstream_rst[0][TCP].seq - ISN["upstream"] - 1
        == view.summary["bytes"]["upstream.downstream"]
    )
    # every leg opens with a handshake, and packets are in time order
    assert [str(p[TCP].flags) for p in packets[:3]] in (["S", "SA", "A"],)
    times = [float(p.time) for p in packets]
    assert times == sorted(times)


async def test_a_clean_close_has_a_fin_each_way_after_the_last_byte(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    from scapy.layers.inet import TCP

    journal = tmp_path / "ok.ndjson"
    assert await journal_of_a_stream(journal) == "fin"
    pcap = tmp_path / "ok.pcap"
    write_pcap(journal, pcap, listen_port=LISTEN, upstream_port=UPSTREAM)
    packets = tcp_packets(pcap)
    assert not [p for p in packets if "R" in str(p[TCP].flags)]
    fins = [p for p in packets if "F" in str(p[TCP].flags)]
    assert len(fins) == 4  # both directions of both legs
    view = read_ndjson(journal)[0]
    fin_to_client = next(p for p in fins if p[TCP].sport == LISTEN)
    assert (
        fin_to_client[TCP].seq - ISN["proxy_client"] - 1
        == view.summary["bytes"]["client.downstream"]
    )


@needs(shutil.which("tshark"), "tshark")
async def test_tshark_sees_the_rst_at_the_journals_offset(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    journal = tmp_path / "run.ndjson"
    await journal_of_a_reset_stream(journal)
    pcap = tmp_path / "run.pcapng"
    write_pcap(journal, pcap, listen_port=LISTEN, upstream_port=UPSTREAM)
    output = subprocess.run(
        [
            "tshark", "-r", str(pcap), "-Y", f"tcp.flags.reset == 1 && tcp.srcport == {LISTEN}",
            "-T", "fields", "-e", "tcp.seq",
        ],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.split()  # fmt: skip
    view = read_ndjson(journal)[0]
    assert output == [str(view.summary["bytes"]["client.downstream"] + 1)]


# ---------------------------------------------------------------- packet comments

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
FIRST, SECOND = b"data: one\n\n", b"data: [DONE]\n\n"


def journal_lines() -> list[dict[str, object]]:
    """A response of a head and two events in two reads on the upstream leg, written to
    the client in one piece after a buffering fault released it, then a timer-driven
    decision with no packet near it."""
    body = HEAD + FIRST + SECOND
    at_second = len(HEAD + FIRST)
    base = {"connection": 7}
    down = {"direction": "downstream", **base}
    return [
        {"type": "open", "time": 10.0, **base},
        {"type": "read", "time": 10.1, "leg": "upstream", "size": at_second, "offset": 0, **down},
        {"type": "fault", "time": 10.1002, "fault": "proxy_buffering", "action": "buffering",
         "byte": 0, **base},
        {"type": "read", "time": 10.2, "leg": "upstream", "size": len(SECOND), "offset": at_second,
         **down},
        {"type": "fault", "time": 10.2001, "fault": "proxy_buffering", "action": "released",
         "size": len(body), **base},
        {"type": "wrote", "time": 10.2003, "leg": "client", "size": len(body), "offset": 0, **down},
        {"type": "http_head", "time": 10.1, "leg": "upstream", "message": 0, "offset": 0,
         "size": len(HEAD), "start_line": "HTTP/1.1 200 OK", "headers": [], **down},
        {"type": "sse_event", "time": 10.1, "leg": "upstream", "message": 0, "offset": len(HEAD),
         "size": len(FIRST), "index": 0, "event": "message", "id": None, "done": False,
         "error": False, **down},
        {"type": "sse_event", "time": 10.2, "leg": "upstream", "message": 0, "offset": at_second,
         "size": len(SECOND), "index": 1, "event": "message", "id": "9", "done": True,
         "error": False, **down},
        {"type": "sse_event", "time": 10.2003, "leg": "client", "message": 0, "offset": at_second,
         "size": len(SECOND), "index": 1, "event": "message", "id": "9", "done": True,
         "error": False, **down},
        {"type": "fault", "time": 12.5, "fault": "idle_reaper", "action": "reaped", **base},
        {"type": "end", "time": 12.5, "leg": "client", "kind": "sent_fin", **down},
        {"type": "bytes", "leg": "upstream", "base64": base64.b64encode(body).decode(), **down},
        {"type": "bytes", "leg": "client", "base64": base64.b64encode(body).decode(), **down},
    ]  # fmt: skip


def write_journal(path: Path, lines: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def comments_by_payload(pcap: Path) -> list[tuple[int, bytes, list[str]]]:
    """(source port, payload, comments) of every packet, read back with scapy."""
    from scapy.layers.inet import TCP
    from scapy.utils import rdpcap

    return [
        (p[TCP].sport, bytes(p[TCP].payload), [c.decode() for c in p.comments or []])
        for p in rdpcap(str(pcap))
    ]


def test_fault_decisions_and_sse_boundaries_become_comments_on_their_packets(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "j.ndjson"
    write_journal(journal, journal_lines())
    pcap = tmp_path / "j.pcapng"
    write_pcap(journal, pcap, listen_port=LISTEN, upstream_port=UPSTREAM)
    packets = comments_by_payload(pcap)
    commented = [(port, payload, notes) for port, payload, notes in packets if notes]
    first_read, second_read, to_client, fin = commented
    # the buffering decision on the read it was taken on, before that read's boundaries
    assert first_read[:2] == (UPSTREAM, HEAD + FIRST)
    assert first_read[2] == [
        "fault proxy_buffering:buffering (byte=0)",
        "HTTP head 0: HTTP/1.1 200 OK (upstream downstream)",
        f"SSE event 0 (message) complete: upstream downstream bytes {len(HEAD)}-"
        f"{len(HEAD + FIRST)}",
    ]
    assert second_read[:2] == (UPSTREAM, SECOND)
    assert second_read[2][0] == "fault proxy_buffering:released (size=77)"
    assert second_read[2][1].startswith("SSE event 1 (message, end of stream, id 9) complete")
    # the client leg's one write carries the client leg's boundary only
    assert to_client[0] == LISTEN and to_client[2] == [
        f"SSE event 1 (message, end of stream, id 9) complete: client downstream bytes "
        f"{len(HEAD + FIRST)}-{len(HEAD + FIRST + SECOND)}"
    ]
    # a timer that fired long after the last byte lands on the FIN it caused
    assert fin[0] == LISTEN and fin[1] == b""
    assert fin[2] == ["fault idle_reaper:reaped"]
    assert len(commented) == 4  # handshakes and pure ACKs carry nothing


def test_a_decision_after_the_last_packet_says_how_far_from_it_it_was(tmp_path: Path) -> None:
    lines = [line for line in journal_lines() if line.get("type") != "end"]
    journal = tmp_path / "late.ndjson"
    write_journal(journal, lines)
    pcap = tmp_path / "late.pcapng"
    write_pcap(journal, pcap, listen_port=LISTEN, upstream_port=UPSTREAM)
    last = comments_by_payload(pcap)[-1]
    assert last[0] == LISTEN
    assert last[2][0] == "fault idle_reaper:reaped, 2299.7 ms after this packet"


def test_classic_pcap_has_the_packets_without_comments(tmp_path: Path) -> None:
    journal = tmp_path / "j.ndjson"
    write_journal(journal, journal_lines())
    count = write_pcap(journal, tmp_path / "j.pcap", listen_port=LISTEN, upstream_port=UPSTREAM)
    packets = comments_by_payload(tmp_path / "j.pcap")
    assert len(packets) == count and not any(notes for _, _, notes in packets)


@needs(shutil.which("tshark"), "tshark")
async def test_tshark_shows_each_sse_event_comment_on_the_frame_that_completes_it(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    journal = tmp_path / "run.ndjson"
    await journal_of_a_reset_stream(journal)
    pcap = tmp_path / "run.pcapng"
    write_pcap(journal, pcap, listen_port=LISTEN, upstream_port=UPSTREAM)
    rows = subprocess.run(
        ["tshark", "-r", str(pcap), "-T", "fields", "-E", "separator=|", "-e", "tcp.srcport",
         "-e", "tcp.seq", "-e", "tcp.len", "-e", "frame.comment"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.splitlines()  # fmt: skip
    view = read_ndjson(journal)[0]
    events = [b for b in view.boundaries if b["type"] == "sse_event"]
    assert {(e["leg"], e["direction"]) for e in events} == {
        ("upstream", "downstream"),
        ("client", "downstream"),
    }
    for event in events:
        port = LISTEN if event["leg"] == "client" else UPSTREAM
        last_byte = event["offset"] + event["size"] - 1
        (row,) = [
            row
            for row in rows
            if f"SSE event {event['index']} (message) complete: {event['leg']} downstream" in row
        ]
        sport, seq, size, _ = row.split("|", 3)
        # tshark's relative sequence numbers give the first byte after the SYN 1
        start = int(seq) - 1
        assert int(sport) == port and start <= last_byte < start + int(size), row


def test_an_output_named_for_no_capture_format_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "j.ndjson"
    write_journal(journal, journal_lines())
    with pytest.raises(CaptureError, match=r"out\.txt: .* end it in \.pcapng .* or \.pcap"):
        write_pcap(journal, tmp_path / "out.txt")
    assert not (tmp_path / "out.txt").exists()
    assert write_pcap(journal, tmp_path / "UPPER.PCAPNG") > 0  # a suffix's case is not its name


def test_a_file_that_is_no_journal_is_refused_before_a_capture_is_written(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"scenarios": []}, indent=2) + "\n")
    with pytest.raises(JournalError, match=r"report\.json:1: not a JSON line"):
        write_pcap(report, tmp_path / "run.pcapng")
    assert not (tmp_path / "run.pcapng").exists()
