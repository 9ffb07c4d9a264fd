"""Which faults of a pipeline are the proxy's own stages is decided per class, with the
answer a runtime Protocol check would give (that check costs tens of µs per
fault on every new connection: docs/performance.md, "Connection setup")."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from faults.latency import Latency
from faults.set_header import SetHeader
from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import ProxyStage, proxy_stages
from middlebox.scenario.model import ProxyOptions


@runtime_checkable
class CheckableStage(ProxyStage, Protocol):
    """The slow reference: what the server used to ask of every fault."""


def test_the_proxy_stages_are_those_the_protocol_check_finds_in_path_order() -> None:
    client_side, upstream_side = PROXY_STAGES.around(ProxyOptions())
    path = [*client_side, Latency(delay=0), SetHeader(), *upstream_side]
    found = proxy_stages(path)
    assert found == [fault for fault in path if isinstance(fault, CheckableStage)]
    stages = [id(fault) for fault in (*client_side, *upstream_side)]
    assert found and all(id(fault) in stages for fault in found)
    assert proxy_stages([Latency(delay=0), SetHeader()]) == []


def test_a_class_with_only_one_of_the_two_flags_is_not_a_stage() -> None:
    class HalfStage:
        finished = True

    class WholeStage(HalfStage):
        connection_closed = False

    half, whole = HalfStage(), WholeStage()
    assert proxy_stages([half, whole, half]) == [whole]  # type: ignore[list-item]
    assert proxy_stages([whole]) == [whole]  # type: ignore[list-item]  # remembered
