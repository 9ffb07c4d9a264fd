"""`middlebox pcap`: a journal becomes TCP packets that read back with the journal's
bytes, sequence numbers, FINs and RSTs (scapy reads the file back; tshark too when it
is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import trio

from middlebox.observe.journal import read_ndjson
from middlebox.observe.pcap import ISN, write_pcap
from tests.harness import needs
from tests.observability.support import EVENTS, controlled, http

LISTEN, UPSTREAM = 9000, 8000


async def journal_of_a_reset_stream(path: Path) -> None:
    """One request through the proxy; the upstream resets after the first event."""
    with trio.fail_after(10):
        async with controlled(end="rst") as run:
            status, body, ended = await http(run.proxy_port, "POST", "/v1/x", b"{}")
            assert (status, ended) == (200, "rst") and EVENTS[0] in body
            with trio.move_on_after(2):
                while run.proxy.active:
                    await trio.sleep(0.01)
            run.proxy.store.write_ndjson(path)


def tcp_packets(pcap: Path) -> list[object]:
    from scapy.layers.inet import TCP
    from scapy.utils import rdpcap

    return [p for p in rdpcap(str(pcap)) if TCP in p]


async def test_an_rst_cut_is_at_the_byte_offset_the_journal_gives(tmp_path: Path) -> None:
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


async def test_a_clean_close_has_a_fin_each_way_after_the_last_byte(tmp_path: Path) -> None:
    from scapy.layers.inet import TCP

    journal = tmp_path / "ok.ndjson"
    with trio.fail_after(10):
        async with controlled() as run:
            assert (await http(run.proxy_port, "POST", "/v1/x", b"{}"))[2] == "fin"
            with trio.move_on_after(2):
                while run.proxy.active:
                    await trio.sleep(0.01)
            run.proxy.store.write_ndjson(journal)
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
async def test_tshark_sees_the_rst_at_the_journals_offset(tmp_path: Path) -> None:
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
