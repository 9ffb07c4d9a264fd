"""HTTP/2 toward the client: one sans-IO `h2` connection, each stream relayed as one HTTP/1.1
connection through the server's usual path (trio shell).

A client that picked `h2` in ALPN gets an `h2.connection.H2Connection` (python-hyper's
sans-IO state machine) fed from its TLS stream. Each request stream gets a loopback TCP
pair (shell/tls.py): `ProxyServer.handle` relays one end like any cleartext client (its own
connection id, pipeline, upstream connection and journal), and this module writes the
stream's request into the other end as HTTP/1.1 and reads the response back, translated by
the pure `core/h2_bridge.py`. So every fault works per stream, and this module only moves
frames.

Ends, both ways (docs/tls-http2.md):
- client END_STREAM -> the request message's end (a chunked body's last chunk); no FIN:
  an HTTP/1.1 request ends by its framing, and nginx never half-closes toward an upstream;
- client RST_STREAM -> an RST on the stream's relay, which the pipeline passes upstream;
- upstream response end (or its FIN after a read-until-close body) -> END_STREAM;
- upstream RST, or a FIN before the response's end -> RST_STREAM (INTERNAL_ERROR), so the
  client sees a reset, never a clean end on half an answer;
- the client's TCP connection closes or resets -> every stream's relay is reset at once:
  one dropped HTTP/2 connection kills all its multiplexed streams.

Hostile clients (docs/tls-http2.md, "Protections"): a stream's relay (its upstream
connection) is started only when one of the connection's `upstream_slots` is free, and
holds it until the relay ends, so a client that opens and resets streams at once (rapid
reset, CVE-2023-44487) never has more than that many upstream connections; a stream reset
while it waits is never dialled. Its resets are counted against a `ResetBudget`
(core/h2_limits.py), and past it the connection ends with GOAWAY ENHANCE_YOUR_CALM.

Connection-level faults (`core/h2_faults.py`: goaway, rst_stream, h2_window,
max_concurrent_streams) are pure; the session feeds them (`H2Faults`) stream opens, DATA and
closes with `now`, wakes them at their deadlines, and performs the `Effects` they answer in
`apply`, the one place their commands (a GOAWAY, an RST_STREAM with their code, a dropped
connection) are done, as the relay's `apply` does a pipeline's; and it keeps to the send
credit they grant.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
import trio

from middlebox.core.fault import (
    DropConnection,
    Effects,
    Fault,
    FaultReport,
    ReportSink,
    ResetStream,
    SendGoaway,
)
from middlebox.core.h2_bridge import (
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RequestEncoder,
    RequestError,
    ResponseBroken,
    ResponseData,
    ResponseDecoder,
    ResponseEnd,
    ResponseEvent,
    ResponseHead,
)
from middlebox.core.h2_faults import H2Fault, H2Faults
from middlebox.core.h2_limits import ENHANCE_YOUR_CALM, ResetBudget
from middlebox.observe.metrics import ServerCounters
from middlebox.shell.tls import READ_SIZE, loopback_pair

# Relays one stream's HTTP/1.1 connection (the proxy's end of its loopback pair) until it
# ends: `ProxyServer.relay_stream`, which gives it a connection id (told to a callback,
# when given one) and counts it.
RelayStream = Callable[..., Awaitable[None]]
# The report sink of a connection id's journal (the server's `report_sink_factory`).
SinkFor = Callable[[int], ReportSink | None]

log = logging.getLogger("middlebox.shell.h2_streams")

# Streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS): nginx's
# http2_max_concurrent_streams default.
MAX_CONCURRENT_STREAMS = 128
# Upstream connections (stream relays) one HTTP/2 connection may hold at once: as many as
# the streams it may have open, as Go's x/net/http2 bounds its handlers by its stream
# limit; a reset frees the stream's slot at once, the relay's only once it has ended.
UPSTREAM_SLOTS = MAX_CONCURRENT_STREAMS
# The client's bytes h2 takes between two checkpoints: one TLS record's worth.
FRAMES_SLICE = 16 * 1024
# Bytes for the client that may wait unsent before the client's own bytes are no longer
# read: every SETTINGS and PING a client sends is answered (an ACK), so one that sends
# them without reading would otherwise grow the answers without end (the SETTINGS and
# PING floods, CVE-2019-9515 and CVE-2019-9512; nghttp2 caps its queued ACKs at 1000,
# `nghttp2_option_set_max_outbound_ack`). A slice of frames adds at most its own size.
OUTBOUND_LIMIT = 1024 * 1024
# SETTINGS_MAX_HEADER_LIST_SIZE: h2's own default (against HPACK bombs, CVE-2016-6581).
MAX_HEADER_LIST_SIZE = 64 * 1024
# How long a connection failing on a protocol error may take to write its GOAWAY.
GOAWAY_FLUSH_SECONDS = 1.0
_LINGER_ABORT = b"\x01\x00\x00\x00\x00\x00\x00\x00"


@dataclass(eq=False)
class _Stream:
    """One HTTP/2 stream and the proxy's end of its relay."""

    stream_id: int
    bridge: trio.SocketStream | None  # None until its relay is started
    encoder: RequestEncoder
    decoder: ResponseDecoder
    ended: bool = False  # END_STREAM or RST_STREAM sent toward the client
    request_over: bool = False
    # The request's bytes toward the relay, each with the flow-controlled length to give
    # back to the client once the relay took them.
    inbound: trio.MemorySendChannel[tuple[bytes, int]] | None = field(default=None, repr=False)
    # Cancels the wait for an upstream slot (the client reset the stream meanwhile).
    waiting: trio.CancelScope = field(default_factory=trio.CancelScope, repr=False)


class H2Session:
    """One client's HTTP/2 connection over `tls`; `run()` serves it until the client goes."""

    def __init__(
        self,
        relay: RelayStream,
        tls: trio.SSLStream[trio.SocketStream],
        connection_id: int,
        faults: Sequence[H2Fault] = (),
        sink_for: SinkFor | None = None,
        counters: ServerCounters | None = None,
        reset_budget: ResetBudget | None = None,
        upstream_slots: int | None = None,
    ) -> None:
        self.relay = relay
        # The server's counters (/metrics), told each protection that acted.
        self._counters = counters
        self.reset_budget = reset_budget or ResetBudget()
        self._upstream_slots = trio.Semaphore(upstream_slots or UPSTREAM_SLOTS)
        self._too_many_resets = False
        self._last_opened = 0  # the newest stream the client opened that the session saw
        # Streams opened by the frames being taken, started once they all are.
        self._opened: list[tuple[_Stream, trio.MemoryReceiveChannel[tuple[bytes, int]]]] = []
        self.faults = list(faults)
        self._h2 = H2Faults(self.faults)
        # The faults' reports go to the journal of the stream they name (their stream's
        # HTTP/1.1 connection), delivered when that stream ends, while its journal is open;
        # a connection-wide report goes to the first stream that ends after it.
        self._sink_for = sink_for
        self._relay_ids: dict[int, int] = {}  # stream id -> its relay's connection id
        self._pending_reports: list[FaultReport] = []
        for fault in self.faults:
            if isinstance(fault, Fault) and sink_for is not None:
                fault.context.report = self._pending_reports.append
        self._timers = trio.lowlevel.ParkingLot()
        self.tls = tls
        self.connection_id = connection_id
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.streams: dict[int, _Stream] = {}
        self._output = trio.lowlevel.ParkingLot()
        self._window = trio.lowlevel.ParkingLot()
        self._closed = False
        # The last stream id of our GOAWAY once draining (see `drain`), and frames written
        # beside h2's own output.
        self._drain_from: int | None = None
        self._raw_frames: list[bytes] = []
        # What the write loop has taken and not yet written (`outbound_pending`): a client
        # that stops reading is not read either once it passes OUTBOUND_LIMIT.
        self._outbound = bytearray()
        self._sending = 0
        self._sent = trio.lowlevel.ParkingLot()
        self._stream_limit = MAX_CONCURRENT_STREAMS  # as announced (a fault may lower it)
        self.protocol_errors = 0
        self._closing = False  # a protocol error: the write loop flushes h2's GOAWAY, then ends
        self._flushed = trio.Event()

    async def run(self) -> None:
        settings = {
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_SIZE,
        }
        for code, value in self._h2.settings().items():
            settings[h2.settings.SettingCodes(code)] = value
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values=settings)
        self.conn.initiate_connection()
        # The preface announces the limit; the session enforces it, as nginx does: a stream
        # past it is refused alone (RST_STREAM REFUSED_STREAM, RFC 9113 §5.1.2, measured
        # against nginx 1.22 in docs/tls-http2.md), where h2 would fail the whole connection
        # (TooManyStreamsError: a PROTOCOL_ERROR GOAWAY and every stream lost).
        limit = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
        self._stream_limit = settings[limit]
        settings[limit] = 2**31 - 1
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values=settings)
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self._write_loop)
                if self._h2:
                    self.apply(self._h2.open(trio.current_time()))
                    nursery.start_soon(self._timer_loop)
                self._kick()
                await self._read_loop()
                self._reset_every_stream()
                nursery.cancel_scope.cancel()
        finally:
            self._reset_every_stream()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.tls)

    def _reset_every_stream(self) -> None:
        """The connection is gone (closed, reset, or a protocol error): each open stream is
        cancelled as if by RST_STREAM, so each upstream connection gets an RST, before the
        stream tasks are cancelled (their cleanup would otherwise close with a FIN)."""
        self._closed = True
        for stream in list(self.streams.values()):
            if not stream.ended:
                self._reset_relay(stream)

    # ------------------------------------------------------------ client -> streams

    async def _read_loop(self) -> None:
        while True:
            try:
                data = await self.tls.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            # A slice at a time, each followed by a checkpoint: one read full of frames
            # (a flood) is never one long stall for the process's other connections, as
            # nginx 1.25.3 bounds the new streams it takes per event-loop iteration.
            for start in range(0, len(data), FRAMES_SLICE):
                if start:
                    await trio.lowlevel.checkpoint()
                while self.outbound_pending > OUTBOUND_LIMIT:
                    self._kick()
                    await self._sent.park()
                if not await self._take(data[start : start + FRAMES_SLICE]):
                    return

    async def _take(self, data: bytes | bytearray) -> bool:
        """Feed the client's bytes to h2 and act on its events; False: the connection ends."""
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as error:
            # Bytes h2 cannot frame (a bad preface, an HTTP/1.1 request on an h2
            # connection, a malformed frame, a CONTINUATION flood) fail the connection.
            log.info("connection %d: HTTP/2 protocol error: %s", self.connection_id, error)
            self.protocol_errors += 1
            await self._fail(PROTOCOL_ERROR)
            return False
        try:
            for event in events:
                if isinstance(event, h2.events.ConnectionTerminated):
                    return False
                self._on_event(event)
                if self._too_many_resets:
                    # Past the reset budget: what else this read carries is not served.
                    log.info("connection %d: %d stream resets, over the budget: GOAWAY "
                             "ENHANCE_YOUR_CALM", self.connection_id,
                             self.reset_budget.resets)  # fmt: skip
                    if self._counters is not None:
                        self._counters.h2_reset_floods += 1
                    # The GOAWAY names the last stream seen before the limit, not the last
                    # one h2 parsed in this read: the ones after it were never served.
                    await self._fail(ENHANCE_YOUR_CALM, self._last_opened)
                    return False
        finally:
            self._start_opened()
            self._kick()
        return True

    def _start_opened(self) -> None:
        """Start the streams these frames opened, but for those they also reset: a stream
        opened and reset in one read (rapid reset) costs no task and is never dialled."""
        for stream, receive in self._opened:
            if stream.ended or self._closed:
                self._never_dialled(stream, receive)
            else:
                self.nursery.start_soon(self._serve_stream, stream, receive)
        self._opened.clear()

    async def _fail(self, error_code: int, last_stream_id: int | None = None) -> None:
        """Fail the connection closed: every stream's relay is reset first (no byte passes
        its faults unseen), then the GOAWAY with `error_code` goes out (RFC 9113 §5.4.1),
        bounded, and the close."""
        self._reset_every_stream()
        # h2 queues its own GOAWAY for a bad frame, not for a bad preface (checked before
        # its frame loop): then it is ours (refused quietly if h2's is there).
        self._guarded(self.conn.close_connection, error_code, None, last_stream_id)
        self._closing = True
        self._kick()
        with trio.move_on_after(GOAWAY_FLUSH_SECONDS):
            await self._flushed.wait()
            await self._lingering_close()

    async def _lingering_close(self) -> None:
        """FIN after the GOAWAY, then the client's bytes read and dropped until it closes:
        closing with unread bytes would send an RST, and the client's kernel would drop the
        GOAWAY unread (nginx's lingering_close, bounded by the caller)."""
        transport = self.tls.transport_stream
        assert isinstance(transport, trio.SocketStream)
        try:
            transport.socket.shutdown(socket.SHUT_WR)
            while await transport.receive_some(READ_SIZE):
                pass
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._open_stream(event)
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id)
            length = event.flow_controlled_length or 0
            if stream is not None:
                # The window reopens once the relay took the bytes (`_upstream_writer`): a
                # relay that stops reading (a slow upstream, a fault) stops the client.
                self._to_upstream(stream, stream.encoder.data(event.data or b""), length)
            elif length:
                self._acknowledge(event.stream_id, length)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.request_over = True
                self._to_upstream(stream, stream.encoder.end())
        elif isinstance(event, h2.events.StreamReset):
            if event.remote_reset and not self.reset_budget.spend(trio.current_time()):
                self._too_many_resets = True
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                stream.ended = True
                self._reset_relay(stream)
                self._stream_closed(stream)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window.unpark_all()

    def _acknowledge(self, stream_id: int, length: int) -> None:
        try:
            self.conn.acknowledge_received_data(length, stream_id)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass

    def _open_stream(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        self._last_opened = stream_id
        if self._drain_from is not None and stream_id > self._drain_from:
            self._send_reset(stream_id, REFUSED_STREAM)
            return
        if sum(not s.ended for s in self.streams.values()) >= self._stream_limit:
            log.info("stream %d refused: over the %d streams announced", stream_id,
                     self._stream_limit)  # fmt: skip
            self._send_reset(stream_id, REFUSED_STREAM)
            return
        encoder = RequestEncoder()
        try:
            head = encoder.head(event.headers or [], end_stream=event.stream_ended is not None)
        except RequestError as error:
            log.info("stream %d refused: %s", stream_id, error)
            self._send_reset(stream_id, REFUSED_STREAM)
            return
        stream = _Stream(stream_id, None, encoder, ResponseDecoder(encoder.method))
        self.streams[stream_id] = stream
        # Unbounded in frames, bounded in bytes: the client may only send what its stream
        # and connection windows allow, and they reopen as the relay takes the bytes.
        send, receive = trio.open_memory_channel[tuple[bytes, int]](math.inf)
        stream.inbound = send
        self._opened.append((stream, receive))
        self._to_upstream(stream, head)
        if self._h2:
            self.apply(self._h2.stream_open(stream_id, trio.current_time()))

    async def _serve_stream(
        self, stream: _Stream, receive: trio.MemoryReceiveChannel[tuple[bytes, int]]
    ) -> None:
        """Start the stream's relay once an upstream slot is free, then serve it; a stream
        the client reset before then is never dialled (its slot wait is cancelled)."""
        with stream.waiting:
            await self._upstream_slots.acquire()
        if stream.waiting.cancelled_caught or stream.ended or self._closed:
            if not stream.waiting.cancelled_caught:
                self._upstream_slots.release()
            self._never_dialled(stream, receive)
            return
        relay_end, proxy_end = loopback_pair()
        bridge = stream.bridge = trio.SocketStream(trio.socket.from_stdlib_socket(proxy_end))
        self.nursery.start_soon(self._hold_slot, stream.stream_id, relay_end)
        self.nursery.start_soon(self._upstream_writer, stream, bridge, receive)
        await self._respond(stream, bridge)

    async def _hold_slot(self, stream_id: int, relay_end: socket.socket) -> None:
        """The stream's relay; its upstream slot is free again once the relay has ended."""
        try:
            if self._sink_for is None:
                await self.relay(relay_end)
            else:  # told the stream's connection id, for its journal
                await self.relay(relay_end, partial(self._note_relay, stream_id))
        finally:
            self._upstream_slots.release()

    def _never_dialled(
        self, stream: _Stream, receive: trio.MemoryReceiveChannel[tuple[bytes, int]]
    ) -> None:
        """A stream reset (by the client, a fault or the connection's end) before its relay
        started: counted, its request bytes dropped and the connection window they took
        given back, and it is over (a drained connection may close)."""
        if self._counters is not None:
            self._counters.h2_streams_reset_before_dial += 1
        if self.streams.pop(stream.stream_id, None) is not None:
            self._stream_closed(stream)
        if stream.inbound is not None:
            stream.inbound.close()
        while True:
            try:
                _data, window = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if window:
                self._acknowledge(stream.stream_id, window)
        receive.close()
        self._kick()

    def _to_upstream(self, stream: _Stream, data: bytes, window: int = 0) -> None:
        if (data or window) and stream.inbound is not None:
            try:
                stream.inbound.send_nowait((data, window))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _upstream_writer(
        self,
        stream: _Stream,
        bridge: trio.SocketStream,
        receive: trio.MemoryReceiveChannel[tuple[bytes, int]],
    ) -> None:
        relay_gone = False
        async for data, window in receive:
            try:
                if data and not relay_gone:
                    await bridge.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                relay_gone = True  # the bytes are dropped, the connection window still reopens
            if window:
                self._acknowledge(stream.stream_id, window)
                self._kick()

    # ------------------------------------------------------------ streams -> client

    async def _respond(self, stream: _Stream, bridge: trio.SocketStream) -> None:
        """Read the stream's HTTP/1.1 response from its relay and send it as frames."""
        try:
            while not stream.ended:
                try:
                    data = await bridge.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    # The relay reset toward the client: the upstream's RST.
                    self._finish(stream, [ResponseBroken("the upstream reset the connection")])
                    break
                events = stream.decoder.feed(data) if data else stream.decoder.feed_eof()
                await self._send_events(stream, events)
                if not data:
                    break
        finally:
            if self.streams.pop(stream.stream_id, None) is not None:
                self._stream_closed(stream)
            self._kick()  # a drained connection closes after its last stream
            if not stream.ended:
                # Cancelled mid-answer (the connection is going): the stream is abandoned,
                # an RST upstream, never a FIN that would look like a finished request.
                stream.ended = True
                self._reset_relay(stream)
            if stream.inbound is not None:
                stream.inbound.close()
            with trio.CancelScope(shield=True):
                # A FIN to the relay's client side once the answer is over: its relay ends.
                await trio.aclose_forcefully(bridge)

    async def _send_events(self, stream: _Stream, events: Sequence[ResponseEvent]) -> None:
        for event in events:
            if stream.ended:
                return
            if isinstance(event, ResponseHead):
                self._guarded(self.conn.send_headers, stream.stream_id, event.headers)
            elif isinstance(event, ResponseData):
                await self._send_data(stream, event.data)
            else:
                self._finish(stream, [event])
            self._kick()

    def _finish(self, stream: _Stream, events: Sequence[ResponseEvent]) -> None:
        if stream.ended:
            return
        stream.ended = True
        for event in events:
            if isinstance(event, ResponseEnd):
                self._guarded(self.conn.end_stream, stream.stream_id)
            elif isinstance(event, ResponseBroken):
                log.info("stream %d reset: %s", stream.stream_id, event.reason)
                self._send_reset(stream.stream_id, event.error_code)
        self._kick()

    async def _send_data(self, stream: _Stream, data: bytes) -> None:
        """DATA frames within the client's flow-control windows (RFC 9113 §5.2): a client
        that stops reading stops this stream's relay, and backpressure reaches upstream."""
        view = memoryview(data)
        while view and not stream.ended and not self._closed:
            try:
                window = min(
                    self.conn.local_flow_control_window(stream.stream_id),
                    self.conn.max_outbound_frame_size,
                )
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
                stream.ended = True
                return
            credit = self._h2.credit(stream.stream_id, trio.current_time()) if self._h2 else None
            if credit is not None:
                window = min(window, credit)
            if window <= 0:
                await self._window.park()
                continue
            piece, view = bytes(view[:window]), view[window:]
            self._guarded(self.conn.send_data, stream.stream_id, piece)
            self._kick()
            if self._h2:
                self.apply(self._h2.stream_data(stream.stream_id, piece, trio.current_time()))

    def _send_reset(self, stream_id: int, code: int) -> None:
        self._guarded(self.conn.reset_stream, stream_id, code)
        self._kick()

    def _guarded(self, call: Callable[..., object], *args: object) -> None:
        """An h2 call on a stream the client may have closed meanwhile."""
        try:
            call(*args)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as error:
            log.debug("connection %d: %s", self.connection_id, error)

    def _reset_relay(self, stream: _Stream) -> None:
        """An RST into the stream's relay (SO_LINGER 0 then close): it passes it upstream.
        A stream still waiting for its upstream slot is never dialled."""
        if stream.bridge is None:
            stream.waiting.cancel()
        else:
            sock = stream.bridge.socket
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
            except OSError:
                pass
            sock.close()
        if stream.inbound is not None:
            stream.inbound.close()

    # ------------------------------------------------------------------ writing

    def _kick(self) -> None:
        self._output.unpark_all()

    def drain(self) -> None:
        """A graceful shutdown, as nginx drains HTTP/2 connections on reload: GOAWAY
        (NO_ERROR) naming the last stream it will serve (RFC 9113 §6.8); streams in flight
        finish, newer ones are refused (REFUSED_STREAM: safe to retry elsewhere), and the
        connection closes once the last stream has ended."""
        self._goaway(self.conn.highest_inbound_stream_id, NO_ERROR)

    def _goaway(self, last_stream_id: int, error_code: int) -> None:
        if self._drain_from is not None:
            return
        self._drain_from = last_stream_id
        # h2's close_connection() would also forbid the in-flight streams' frames (its
        # state machine is CLOSED after a GOAWAY), so the frame is written beside it.
        goaway = hyperframe.frame.GoAwayFrame(0)
        goaway.last_stream_id = last_stream_id
        goaway.error_code = error_code
        self._raw_frames.append(goaway.serialize())
        # Streams the client opened past it are refused (REFUSED_STREAM, RFC 9113 §8.7).
        for stream in list(self.streams.values()):
            if stream.stream_id > last_stream_id and not stream.ended:
                self._cancel_stream(stream, REFUSED_STREAM)
        self._kick()

    # ------------------------------------------------------------ connection-level faults

    def _stream_closed(self, stream: _Stream) -> None:
        if self._h2:
            self.apply(self._h2.stream_close(stream.stream_id, trio.current_time()))
        self._deliver_reports(stream.stream_id)

    def _note_relay(self, stream_id: int, connection_id: int) -> None:
        self._relay_ids[stream_id] = connection_id

    def _deliver_reports(self, stream_id: int) -> None:
        relay_id = self._relay_ids.get(stream_id)
        if self._sink_for is None or relay_id is None or not self._pending_reports:
            return
        sink = self._sink_for(relay_id)
        kept = []
        for report in self._pending_reports:
            named = report.details.get("stream_id")
            if named is None or named == stream_id:
                if sink is not None:
                    sink(report)
            else:
                kept.append(report)
        self._pending_reports[:] = kept

    def apply(self, effects: Effects) -> None:
        """Do what the connection's faults asked (`H2Faults`): their commands, in order;
        the timer loop then recomputes its wait, as a deadline may have moved."""
        for command in effects.commands:
            if isinstance(command, ResetStream):
                stream = self.streams.get(command.stream_id)
                if stream is not None and not stream.ended:
                    self._cancel_stream(stream, command.error_code)
            elif isinstance(command, SendGoaway):
                self._goaway(command.last_stream_id, command.error_code)
            elif isinstance(command, DropConnection):
                self._drop_connection(command.how)
        self._timers.unpark_all()

    def _cancel_stream(self, stream: _Stream, error_code: int) -> None:
        """RST_STREAM toward the client, an RST into the stream's relay toward the upstream."""
        stream.ended = True
        self._send_reset(stream.stream_id, error_code)
        self._reset_relay(stream)

    def _drop_connection(self, how: str) -> None:
        """The TCP connection goes without a GOAWAY: every stream's relay is reset, then the
        client's socket is closed (with an RST for `rst`: SO_LINGER 0)."""
        self._reset_every_stream()
        if how == "rst":
            try:
                self.tls.transport_stream.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT
                )
            except OSError:
                pass
        self.nursery.cancel_scope.cancel()

    async def _timer_loop(self) -> None:
        """Wake the faults at their deadlines; a deadline that fired without moving waits
        for the next event (a send credit that is there but unused)."""
        fired: float | None = None
        while True:
            due = self._h2.deadline()
            if due is None or (fired is not None and due <= fired):
                await self._timers.park()
                fired = None
                continue
            with trio.move_on_at(due) as timer:
                await self._timers.park()
            if not timer.cancelled_caught:
                continue  # an event came first: recompute
            fired = due
            self.apply(self._h2.wake(trio.current_time()))
            self._window.unpark_all()  # a send credit may have grown
            self._kick()

    def _pull_output(self) -> None:
        """h2's bytes to send (and the frames written beside it) into `_outbound`."""
        self._outbound += self.conn.data_to_send()
        if self._raw_frames:
            self._outbound += b"".join(self._raw_frames)
            self._raw_frames.clear()

    @property
    def outbound_pending(self) -> int:
        """Bytes for the client not yet taken by its socket."""
        self._pull_output()
        return len(self._outbound) + self._sending

    async def _write_loop(self) -> None:
        while True:
            self._pull_output()
            data = bytes(self._outbound)
            self._outbound.clear()
            if not data:
                if self._closing:
                    self._flushed.set()
                    return
                if self._drain_from is not None and not self.streams:
                    self.nursery.cancel_scope.cancel()  # drained: everything is written
                    return
                await self._output.park()
                continue
            self._sending = len(data)
            try:
                await self.tls.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.nursery.cancel_scope.cancel()
                return
            self._sending = 0
            self._sent.unpark_all()


async def serve_h2(
    relay: RelayStream,
    tls: trio.SSLStream[trio.SocketStream],
    connection_id: int,
    sessions: set[H2Session] | None = None,
    faults: Sequence[H2Fault] = (),
    sink_for: SinkFor | None = None,
    counters: ServerCounters | None = None,
) -> None:
    """Serve one HTTP/2 client connection until it closes; `relay` relays each stream.
    The session is in `sessions` meanwhile (the server drains them at shutdown); `faults`
    are the connection's HTTP/2 faults, bound to it, their reports journaled per stream
    through `sink_for`; `counters` count each protection that acted."""
    session = H2Session(relay, tls, connection_id, faults, sink_for, counters)
    if sessions is not None:
        sessions.add(session)
    try:
        await session.run()
    finally:
        if sessions is not None:
            sessions.discard(session)
