"""The fault library: one module per fault, module name = YAML name.

`REGISTRY` is explicit, so adding a fault is a visible one-line change here and an
architecture test fails when a `Fault` subclass is left out.
"""

from __future__ import annotations

from faults.bandwidth import Bandwidth
from faults.buffer_whole_response import BufferWholeResponse
from faults.client_vanish import ClientVanish
from faults.coalescer import Coalescer
from faults.connection_limit import ConnectionLimit
from faults.cut import Cut
from faults.goaway import Goaway
from faults.gzip_encoding import GzipEncoding
from faults.h2_window import H2Window
from faults.handoff import Handoff
from faults.http10_upstream import Http10Upstream
from faults.http_error import HttpError
from faults.idle_reaper import IdleReaper
from faults.ignore_client_close import IgnoreClientClose
from faults.inband_error import InbandError
from faults.latency import Latency
from faults.link import Link
from faults.max_concurrent_streams import MaxConcurrentStreams
from faults.max_duration import MaxDuration
from faults.proxy_buffering import ProxyBuffering
from faults.rst_stream import RstStream
from faults.set_header import SetHeader
from faults.slicer import Slicer
from faults.slow_reader import SlowReader
from faults.sse_ids import SseIds
from faults.sse_retry import SseRetry
from faults.strip_header import StripHeader
from middlebox.core.fault import Fault

REGISTRY: dict[str, type[Fault]] = {
    cls.name: cls
    for cls in (
        Latency,
        Bandwidth,
        Link,
        Slicer,
        Coalescer,
        Handoff,
        IdleReaper,
        Cut,
        GzipEncoding,
        MaxDuration,
        ProxyBuffering,
        BufferWholeResponse,
        SlowReader,
        StripHeader,
        SetHeader,
        HttpError,
        Http10Upstream,
        InbandError,
        SseIds,
        SseRetry,
        ClientVanish,
        IgnoreClientClose,
        ConnectionLimit,
        Goaway,
        RstStream,
        H2Window,
        MaxConcurrentStreams,
    )
}

__all__ = ["REGISTRY"]
