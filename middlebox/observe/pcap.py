"""`middlebox pcap JOURNAL -o run.pcapng`: a connection journal as TCP packets (scapy).

Each journaled connection becomes two TCP connections on 127.0.0.1, so a run opens
in Wireshark or tshark with "Follow TCP stream" working on both legs:
- the client leg: client `127.0.0.1:(40000 + id)` ↔ proxy `127.0.0.1:listen_port`;
- the upstream leg: proxy `127.0.0.1:(50000 + id)` ↔ upstream `127.0.0.1:upstream_port`.

Both get a three-way handshake at the connection's open time; every journaled chunk
becomes segments (at most `MSS` bytes each) at the chunk's time, with sequence
numbers from the journal's stream offsets (RFC 9293: a segment's sequence number is
ISN + 1 + the offset of its first byte, the SYN taking one) and the peer's next
expected byte as ACK; a FIN consumes one sequence number; an RST carries the
sequence number of the next byte the sender would have sent, so its relative
sequence number is the journal's byte offset where the stream was cut. Payload
comes from the journal's captured bytes (zeros where capture was bounded).

In pcapng every packet that carries a protocol boundary or follows a fault decision
gets a packet comment (an Enhanced Packet Block's `opt_comment`, option code 1 of the
pcapng spec, draft-ietf-opsawg-pcapng), shown by Wireshark in the packet list and as
`frame.comment` in tshark:
- an SSE event on the packet carrying its last byte (where a client can dispatch it):
  `SSE event 3 (message) complete: client downstream bytes 428-702`;
- an HTTP head on the packet carrying its first byte, a message's end on its last;
- a fault decision on the packet it was taken on (one read under a millisecond
  before it), else the first packet after it on either leg (a timer that fired in
  silence: the first the decision can have shaped), else the last packet, saying how
  far the decision lies from the packet when that is 1 ms or more:
  `fault proxy_buffering:released (response=0 byte=4096)`,
  `fault idle_reaper:reaped, 2.5 ms before this packet`.
Classic pcap has no comments; `.pcap` output carries the packets alone.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from middlebox.observe.journal import JournalView, read_ndjson

MSS = 16 * 1024
ISN = {"client": 1000, "proxy_client": 2000, "proxy_upstream": 3000, "upstream": 4000}
HOST = "127.0.0.1"
# a decision this close after a packet was taken on it (the driver runs faults on each read)
DECIDED_ON = 0.001


@dataclass
class _Flow:
    """One leg: the two endpoints' ports, ISNs and next sequence numbers."""

    ports: dict[str, int]  # "up" = sender of UPSTREAM bytes, "down" = sender of DOWNSTREAM
    isn: dict[str, int]
    sent: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    fin: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})

    def seq(self, side: str) -> int:
        return self.isn[side] + 1 + self.sent[side] + self.fin[side]

    def ack(self, side: str) -> int:
        other = "down" if side == "up" else "up"
        return self.seq(other)


def _flows(connection: int, listen_port: int, upstream_port: int) -> dict[str, _Flow]:
    return {
        "client": _Flow(
            {"up": 40000 + connection % 10000, "down": listen_port},
            {"up": ISN["client"], "down": ISN["proxy_client"]},
        ),
        "upstream": _Flow(
            {"up": 50000 + connection % 10000, "down": upstream_port},
            {"up": ISN["proxy_upstream"], "down": ISN["upstream"]},
        ),
    }


def _segment(flow: _Flow, side: str, flags: str, payload: bytes, when: float) -> Any:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    other = "down" if side == "up" else "up"
    tcp = TCP(
        sport=flow.ports[side],
        dport=flow.ports[other],
        flags=flags,
        seq=flow.seq(side),
        ack=flow.ack(side) if "A" in flags else 0,
        window=65535,
    )
    packet = Ether() / IP(src=HOST, dst=HOST) / tcp
    if payload:
        packet = packet / payload
    packet.time = when
    return packet


def connection_packets(
    view: JournalView, listen_port: int = 9000, upstream_port: int = 8000
) -> list[Any]:
    """The packets of one journaled connection, both legs, in time order."""
    flows = _flows(view.connection, listen_port, upstream_port)
    packets: list[tuple[float, int, Any]] = []

    def add(when: float, packet: Any) -> None:
        packets.append((when, len(packets), packet))

    # (leg, direction) -> [(first byte offset, end offset, index into `packets`)]
    carried: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    opened = view.opened_at or min((c["time"] for c in view.chunks), default=0.0)
    for leg, flow in flows.items():
        first = min(
            (float(c["time"]) for c in view.chunks + view.ends if c["leg"] == leg),
            default=opened,
        )
        start = min(opened, first)
        # The handshake: SYN and SYN-ACK consume one sequence number each.
        add(start, _syn(flow, "up", "S", start))
        add(start, _syn(flow, "down", "SA", start))
        add(start, _segment(flow, "up", "A", b"", start))

    events = sorted(
        [(float(c["time"]), 0, c) for c in view.chunks]
        + [(float(e["time"]), 1, e) for e in view.ends],
        key=lambda entry: (entry[0], entry[1]),
    )
    closed: set[tuple[str, str]] = set()
    for when, _, line in events:
        leg = line["leg"]
        flow = flows[leg]
        side = "up" if line["direction"] == "upstream" else "down"
        if "size" in line:
            data = view.captured.get((leg, line["direction"]), b"")
            offset, size = int(line["offset"]), int(line["size"])
            payload = data[offset : offset + size]
            payload += bytes(size - len(payload))
            for start in range(0, size, MSS):
                piece = payload[start : start + MSS]
                carried.setdefault((leg, line["direction"]), []).append(
                    (offset + start, offset + start + len(piece), len(packets))
                )
                add(when, _segment(flow, side, "PA", piece, when))
                flow.sent[side] += len(piece)
            continue
        kind = str(line["kind"])
        sender = side
        if kind == "write_failed":
            # our write failed: the receiver had gone, as if it had reset us
            sender = "down" if side == "up" else "up"
            kind = "read_rst"
        if (leg, sender) in closed:
            continue
        if kind.endswith("_fin"):
            add(when, _segment(flow, sender, "FA", b"", when))
            flow.fin[sender] = 1
            closed.add((leg, sender))
        elif kind.endswith("_rst"):
            add(when, _segment(flow, sender, "RA", b"", when))
            closed.update({(leg, "up"), (leg, "down")})
    _comment(view, packets, carried)
    packets.sort(key=lambda entry: (entry[0], entry[1]))
    return [packet for _, _, packet in packets]


def _comment(
    view: JournalView,
    packets: list[tuple[float, int, Any]],
    carried: dict[tuple[str, str], list[tuple[int, int, int]]],
) -> None:
    """Attach each boundary and fault decision of `view` to its packet as a comment
    (fault decisions first: Wireshark's comment column shows a packet's first one)."""
    notes: dict[int, tuple[list[str], list[str]]] = {}
    # a leg's segments are appended in stream order, so their first offsets are sorted
    starts = {key: [start for start, _, _ in spans] for key, spans in carried.items()}
    for boundary in view.boundaries:
        key = (str(boundary.get("leg")), str(boundary.get("direction")))
        placed = _boundary_comment(boundary)
        if placed is None or key not in carried:
            continue
        byte, text = placed
        position = bisect.bisect_right(starts[key], byte) - 1
        if position >= 0 and byte < carried[key][position][1]:
            notes.setdefault(carried[key][position][2], ([], []))[1].append(text)
    ordered = sorted(range(len(packets)), key=lambda i: (packets[i][0], packets[i][1]))
    times = [packets[i][0] for i in ordered]
    for decision in view.faults if ordered else []:
        when = float(decision["time"])
        # the packet the decision was taken on (read under a millisecond before it),
        # else the first one after it, else the last one
        position = bisect.bisect_right(times, when)
        if position and (when - times[position - 1] < DECIDED_ON or position == len(times)):
            position -= 1
        target = ordered[position]
        lag = (packets[target][0] - when) * 1000
        details = " ".join(
            f"{key}={value}"
            for key, value in decision.items()
            if key not in ("type", "time", "fault", "action", "connection")
        )
        text = f"fault {decision.get('fault')}:{decision.get('action')}"
        text += f" ({details})" if details else ""
        if abs(lag) >= 1.0:
            text += f", {abs(lag):.1f} ms {'before' if lag > 0 else 'after'} this packet"
        notes.setdefault(target, ([], []))[0].append(text)
    for index, (faults, boundaries) in notes.items():
        packets[index][2].comments = [text.encode() for text in faults + boundaries]


def _boundary_comment(boundary: dict[str, Any]) -> tuple[int, str] | None:
    """The stream byte a boundary's comment belongs on, and the comment."""
    leg, direction = boundary.get("leg"), boundary.get("direction")
    offset = int(boundary.get("offset") or 0)
    kind = boundary.get("type")
    if kind == "sse_event":
        # an event is dispatched when its blank line arrives: the packet with its last byte
        size = int(boundary.get("size") or 0)
        flags = [str(boundary.get("event") or "message")]
        flags += ["end of stream"] if boundary.get("done") else []
        flags += ["error"] if boundary.get("error") else []
        flags += [f"id {boundary['id']}"] if boundary.get("id") is not None else []
        text = (
            f"SSE event {boundary.get('index')} ({', '.join(flags)}) complete: "
            f"{leg} {direction} bytes {offset}-{offset + size}"
        )
        return offset + max(size, 1) - 1, text
    if kind == "http_head":
        text = f"HTTP head {boundary.get('message')}: {boundary.get('start_line', '')}"
        return offset, f"{text} ({leg} {direction})"
    if kind == "http_end":
        # `offset` is where the message ended: its last byte is the one before
        text = f"HTTP message {boundary.get('message')} ends: {leg} {direction} byte {offset}"
        return max(offset - 1, 0), text
    return None


def _syn(flow: _Flow, side: str, flags: str, when: float) -> Any:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    other = "down" if side == "up" else "up"
    tcp = TCP(
        sport=flow.ports[side],
        dport=flow.ports[other],
        flags=flags,
        seq=flow.isn[side],
        ack=flow.isn[other] + 1 if "A" in flags else 0,
        window=65535,
    )
    packet = Ether() / IP(src=HOST, dst=HOST) / tcp
    packet.time = when
    return packet


def journal_packets(
    views: Iterable[JournalView], listen_port: int = 9000, upstream_port: int = 8000
) -> list[Any]:
    packets: list[Any] = []
    for view in views:
        packets += connection_packets(view, listen_port, upstream_port)
    packets.sort(key=lambda packet: float(packet.time))
    return packets


# The capture's format by its file's suffix: what Wireshark and tshark expect of each name.
CAPTURE_FORMATS = {".pcapng": "pcapng", ".pcap": "pcap"}


class CaptureError(ValueError):
    """An output name whose suffix names no capture format."""


def write_pcap(
    journal: str | Path, out: str | Path, *, listen_port: int = 9000, upstream_port: int = 8000
) -> int:
    """Write `out` (pcapng, or classic pcap when it ends in .pcap); returns the packet count.
    Any other suffix is a CaptureError: a `.txt` holding pcapng would open in no text
    editor and be found by no capture tool's file filter."""
    from scapy.utils import wrpcap, wrpcapng

    capture_format = CAPTURE_FORMATS.get(Path(out).suffix.lower())
    if capture_format is None:
        raise CaptureError(
            f"{out}: the capture's format comes from its name: end it in .pcapng "
            "(packets with comments) or .pcap (packets alone)"
        )
    packets = journal_packets(read_ndjson(journal), listen_port, upstream_port)
    writer = wrpcap if capture_format == "pcap" else wrpcapng
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    writer(str(out), packets)
    return len(packets)
