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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from middlebox.observe.journal import JournalView, read_ndjson

MSS = 16 * 1024
ISN = {"client": 1000, "proxy_client": 2000, "proxy_upstream": 3000, "upstream": 4000}
HOST = "127.0.0.1"


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
    order = 0

    def add(when: float, packet: Any) -> None:
        nonlocal order
        packets.append((when, order, packet))
        order += 1

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
    packets.sort(key=lambda entry: (entry[0], entry[1]))
    return [packet for _, _, packet in packets]


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


def write_pcap(
    journal: str | Path, out: str | Path, *, listen_port: int = 9000, upstream_port: int = 8000
) -> int:
    """Write `out` (pcapng, or classic pcap when it ends in .pcap); returns the packet count."""
    from scapy.utils import wrpcap, wrpcapng

    packets = journal_packets(read_ndjson(journal), listen_port, upstream_port)
    writer = wrpcap if str(out).endswith(".pcap") else wrpcapng
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    writer(str(out), packets)
    return len(packets)
