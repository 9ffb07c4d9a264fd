"""Byte-exact error responses as real proxies send them (pure).

When middlebox stands in for a proxy that answers by itself (upstream unreachable,
an idle timeout before the headers, an injected 429), the client should see what
it would see in production. The default shape is nginx's: its `ngx_http_special_response.c`
error pages, `Content-Type: text/html` and `Connection: close`.
"""

from __future__ import annotations

from http import HTTPStatus

# Where nginx's status lines and page titles differ from RFC 9110's reason phrases
# (ngx_http_header_filter_module.c `ngx_http_status_lines`, ngx_http_special_response.c).
NGINX_REASONS = {
    302: "Moved Temporarily",
    413: "Request Entity Too Large",
    414: "Request-URI Too Large",
    416: "Requested Range Not Satisfiable",
    504: "Gateway Time-out",
}


def reason(status: int) -> str:
    """The reason phrase nginx writes for `status`."""
    return NGINX_REASONS.get(status) or HTTPStatus(status).phrase


def nginx_error_page(status: int) -> bytes:
    """The HTML body nginx sends for an error status (ngx_http_error_tail + title)."""
    title = f"{status} {reason(status)}"
    return (
        f"<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n"
        f"<center><h1>{title}</h1></center>\r\n<hr><center>nginx</center>\r\n"
        "</body>\r\n</html>\r\n"
    ).encode("ascii")


def error_response(
    status: int,
    body: bytes | None = None,
    *,
    content_type: str = "text/html",
    extra_headers: list[tuple[str, str]] | None = None,
    server: str | None = "nginx",
    connection: str | None = "close",
) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, like a proxy's own answer.

    `server=None` omits the Server field; `connection=None` omits Connection, so the
    connection persists (HTTP/1.1's default, RFC 9112 §9.3)."""
    payload = nginx_error_page(status) if body is None else body
    lines = [f"HTTP/1.1 {status} {reason(status)}"]
    lines += [f"Server: {server}"] if server is not None else []
    lines += [f"Content-Type: {content_type}", f"Content-Length: {len(payload)}"]
    lines += [f"Connection: {connection}"] if connection is not None else []
    lines += [f"{name}: {value}" for name, value in extra_headers or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


APACHE_PROXY_ERROR = (
    b'<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 4.01//EN" "http://www.w3.org/TR/html4/strict.dtd">\n'
    b"<html><head>\n<title>502 Proxy Error</title>\n</head><body>\n<h1>Proxy Error</h1>\n"
    # two CRLFs inside the text, as mod_proxy's message string has them
    b"<p>The proxy server received an invalid\r\nresponse from an upstream server.<br />\r\n"
    b"The proxy server could not handle the request<p>Reason: <strong>Error reading from "
    b"remote server</strong></p></p>\n</body></html>\n"
)
"""Apache httpd 2.4 mod_proxy's page when the backend times out before its status line
(AH01102 "error reading status line from remote server", then ap_proxyerror), as the
real Apache 2.4 sent it to `make calibrate` (381 bytes)."""


def apache_proxy_error() -> bytes:
    """Apache's `502 Proxy Error` answer: its own reason phrase, a Latin-1 HTML page and
    no Connection field (the proxy ends the connection right after it anyway)."""
    head = (
        "HTTP/1.1 502 Proxy Error\r\nServer: Apache\r\n"
        f"Content-Length: {len(APACHE_PROXY_ERROR)}\r\n"
        "Content-Type: text/html; charset=iso-8859-1\r\n\r\n"
    )
    return head.encode("latin-1") + APACHE_PROXY_ERROR
