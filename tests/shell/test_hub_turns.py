"""The read hub's wake-ups and turns (shell/hub.py): a socket that comes ready during a
turn is served in the same wake-up, up to TURNS_PER_WAKE turns before the hub goes back to
trio; what waits for a turn's end (`after_turn`) runs after the turn's callbacks and
writes, and one asked for outside a turn runs on the next. Real socket pairs, driven
by the hub's own callbacks."""

from __future__ import annotations

import socket
from collections.abc import Callable

import trio

from middlebox.shell.hub import TURNS_PER_WAKE, ReadHub, acquire_read_hub, release_read_hub


def chain(hub: ReadHub, links: int, served: list[int]) -> tuple[list[socket.socket], socket.socket]:
    """`links` socket pairs on the hub, each one's callback reading its byte and sending one
    into the next pair, so link N+1 comes ready during the turn that serves link N. Returns
    every socket (to close) and the far end that starts the chain."""
    pairs = [socket.socketpair() for _ in range(links)]
    for near, far in pairs:
        near.setblocking(False)
        far.setblocking(False)

    def link(number: int) -> Callable[[], None]:
        near = pairs[number][0]

        def ready() -> None:
            near.recv(16)
            served.append(number)
            if number + 1 < links:
                pairs[number + 1][1].send(b"x")

        return ready

    for number, (near, _) in enumerate(pairs):
        hub.register(near, link(number))
    return [sock for each in pairs for sock in each], pairs[0][1]


async def served_in_wakes(links: int) -> tuple[list[int], int]:
    """The chain of `links` run from its first byte: the links served, and the hub's
    wake-ups it took."""
    hub = acquire_read_hub()
    served: list[int] = []
    sockets, start = chain(hub, links, served)
    try:
        await trio.lowlevel.checkpoint()  # the hub is asleep in trio's wait
        wakes = hub.wakes
        with trio.fail_after(5):
            start.send(b"x")
            while len(served) < links:
                await trio.lowlevel.checkpoint()
        return served, hub.wakes - wakes
    finally:
        for sock in sockets[::2]:
            hub.unregister(sock, hub.callbacks[sock.fileno()])
        for sock in sockets:
            sock.close()
        release_read_hub(hub)


async def test_a_socket_made_ready_in_a_turn_is_served_in_the_same_wake_up() -> None:
    served, wakes = await served_in_wakes(TURNS_PER_WAKE)
    assert served == list(range(TURNS_PER_WAKE))
    assert wakes == 1


async def test_past_turns_per_wake_the_hub_goes_back_to_trio_first() -> None:
    """A chain one longer than the bound needs a second wake-up: trio's other tasks get
    their turn between."""
    served, wakes = await served_in_wakes(TURNS_PER_WAKE + 1)
    assert served == list(range(TURNS_PER_WAKE + 1))
    assert wakes == 2


async def test_what_waits_for_a_turns_end_runs_after_its_callbacks_and_writes() -> None:
    hub = acquire_read_hub()
    order: list[str] = []
    pairs = [socket.socketpair() for _ in range(2)]

    def reader(name: str, sock: socket.socket) -> Callable[[], None]:
        def ready() -> None:
            sock.recv(16)
            order.append(f"read {name}")
            hub.write_soon(lambda: order.append(f"write {name}"))
            hub.after_turn(lambda: order.append(f"end {name}"))

        return ready

    try:
        for name, (near, _) in zip("ab", pairs, strict=True):
            near.setblocking(False)
            hub.register(near, reader(name, near))
        await trio.lowlevel.checkpoint()
        with trio.fail_after(5):
            for _, far in pairs:
                far.send(b"x")  # both ready before the hub wakes: one turn serves them
            while len(order) < 6:
                await trio.lowlevel.checkpoint()
        # outside a turn (this task): on the hub's next turn, by its timer
        hub.after_turn(lambda: order.append("end outside"))
        assert order[-1] != "end outside"
        with trio.fail_after(5):
            while order[-1] != "end outside":
                await trio.lowlevel.checkpoint()
    finally:
        for near, far in pairs:
            hub.unregister(near, hub.callbacks[near.fileno()])
            near.close()
            far.close()
        release_read_hub(hub)
    reads, writes, ends = order[:2], order[2:4], order[4:6]
    assert sorted(reads) == ["read a", "read b"]
    assert writes == [each.replace("read", "write") for each in reads]
    assert ends == [each.replace("read", "end") for each in reads]
