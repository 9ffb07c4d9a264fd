"""Addresses as the command line gives them, and listeners that cannot open.

`Address.parse` takes HOST:PORT, [IPv6]:PORT or an http(s) URL and refuses a port beyond
TCP's 16 bits (a larger number would be cut to its low bits, or make bind() raise an
OverflowError). A listener that cannot open says which of the proxy's listeners it was
(`ListenError.role`), so the error names the option that asked for it."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from middlebox.run.serve import LIBRARY_SCENARIOS, proxy_config
from middlebox.scenario.model import Scenario
from middlebox.shell.control import ControlApi, ControlledProxy, serve_control
from middlebox.shell.server import Address, ListenError, listen
from middlebox.shell.workers import reuseport_listeners


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:0", Address("127.0.0.1", 0)),
        ("127.0.0.1:65535", Address("127.0.0.1", 65535)),
        ("[::1]:9000", Address("::1", 9000)),
        (":9000", Address("127.0.0.1", 9000)),
        ("http://127.0.0.1:65535", Address("127.0.0.1", 65535)),
        ("http://127.0.0.1", Address("127.0.0.1", 80)),
        ("https://api.example", Address("api.example", 443, tls=True)),
    ],
)
def test_host_port_and_urls_in_range_are_parsed(text: str, address: Address) -> None:
    assert Address.parse(text) == address


def test_a_url_with_port_0_keeps_port_0_rather_than_the_default() -> None:
    assert Address.parse("http://127.0.0.1:0").port == 0
    assert Address.parse("https://127.0.0.1:0").port == 0


@pytest.mark.parametrize(
    "text",
    [
        "127.0.0.1:65536",
        "127.0.0.1:70000",
        "[::1]:99999",
        "http://127.0.0.1:70000",
        "h:1" + "0" * 20,
    ],
)
def test_a_port_beyond_65535_is_refused_in_one_sentence(text: str) -> None:
    with pytest.raises(ValueError) as refused:
        Address.parse(text)
    assert str(refused.value) == f"expected a port from 0 to 65535, got {text!r}"


@pytest.mark.parametrize("text", ["notaurl", "127.0.0.1:", "127.0.0.1:-1", "127.0.0.1:٣"])
def test_what_is_not_host_port_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        Address.parse(text)


@pytest.fixture
def busy() -> Iterator[Address]:
    """A loopback address another socket listens on."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        yield Address("127.0.0.1", taken.getsockname()[1])


def assert_busy(error: ListenError, role: str, address: Address) -> None:
    assert (error.role, error.address, error.errno) == (role, address, errno.EADDRINUSE)


def test_the_proxys_own_listener_names_itself_listen(busy: Address) -> None:
    with pytest.raises(ListenError) as raised:
        listen(busy)
    assert_busy(raised.value, "listen", busy)
    with pytest.raises(ListenError) as raised:
        reuseport_listeners(busy, 2)  # --workers' listeners
    assert_busy(raised.value, "listen", busy)


def test_a_free_address_listens_without_error() -> None:
    sock = listen(Address("127.0.0.1", 0))
    sock.close()


async def test_the_control_api_names_its_listener_control(busy: Address) -> None:
    proxy = ControlledProxy(
        proxy_config(Address("127.0.0.1", 1), Scenario(name="x")), loader=LIBRARY_SCENARIOS
    )
    with pytest.raises(ListenError) as raised:
        await serve_control(ControlApi(proxy), busy)
    assert_busy(raised.value, "control", busy)
