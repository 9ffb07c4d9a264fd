"""`python -m calibrate.upstream --config FILE`: the emulator as nginx's default upstream sees it.

nginx talks HTTP/1.0 to its upstream by default (`proxy_http_version 1.0`), and vLLM
(uvicorn/h11) answers an HTTP/1.0 request to a stream without chunked encoding: the
body is delimited by the connection's close (RFC 9112 §6.3, rule 8). The embedded
emulator calls aiohttp's `enable_chunked_encoding()` for every stream, which aiohttp
refuses for HTTP/1.0 ("Using chunked encoding is forbidden for HTTP/1.0"), so such a
request gets a 500. aiohttp already chunks an HTTP/1.1 response of unknown length on
its own, so dropping that call changes nothing for HTTP/1.1 and gives HTTP/1.0 the
close-delimited body uvicorn sends. Until the emulator does this itself, calibration
starts it through this module.
"""

from __future__ import annotations

from aiohttp.web import StreamResponse

from vllm_emulator.app import SseResponse
from vllm_emulator.cli import emulate


def _length_decides(self: StreamResponse, chunk_size: int | None = None) -> None:
    """aiohttp picks chunked (HTTP/1.1) or close-delimited (HTTP/1.0) itself."""


SseResponse.enable_chunked_encoding = _length_decides  # type: ignore[method-assign]

if __name__ == "__main__":
    emulate(prog_name="python -m calibrate.upstream")
