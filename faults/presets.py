"""Named presets: the faults that together behave like a real hop with its default config.

`- preset: nginx-default` in a scenario's path expands to the list below (path order,
client side first, like any path). Each preset was measured side by side against the
real proxy from Debian 12's packages (nginx 1.22.1, HAProxy 2.6.12, Apache 2.4,
Caddy 2.6.2) by `make calibrate`; docs/calibration.md has the table, the tolerances
and what a preset does not reproduce. The values are each proxy's *defaults*; a
scenario that needs another timeout writes the faults out with its own values.

`PRESET_PROXY` holds what a preset sets of the proxy's own behaviour, which is not a fault:
the nginx presets turn on nginx's client timers (faults/_proxy/request_timeouts.py). The
composition root joins both into the presets the loader reads; a scenario's own `proxy:`
block wins over a preset's (`proxy: {keepalive_timeout: null}` turns one off).

What was measured, in short (a 60-token stream at 20 ms ITL through each):
- nginx with its defaults buffers: ~4 KiB bursts, the first with the head, and learns
  at once (≈1 ms) that the client left (it watches the client socket,
  ngx_http_upstream_check_broken_connection). On `proxy_read_timeout` after the head
  it closes without the terminal chunk.
- HAProxy forwards every read but sends it with MSG_MORE, so Linux corks it until a
  full segment or one RTO (204 ms on loopback): bursts every ~200 ms on loopback
  (every MSS elsewhere); `option http-no-delay` turns it off. A client's FIN is not an
  abort: it learns when a write fails, after the cork released the first one (224 ms,
  12 tokens).
- Apache's mod_proxy_http flushes every read; it learns when the second write after
  the client's FIN fails (≈2 tokens).
- Caddy flushes text/event-stream at once and aborts the upstream request as soon as
  the client goes (Go's request context), with no read timeout by default.
"""

from __future__ import annotations

# nginx's proxy_buffering (ngx_http_proxy_module): `proxy_buffering on`, `proxy_buffer_size
# 4k|8k` and `proxy_buffers 8 4k|8k` (one memory page: 4k on x86-64), `proxy_http_version
# 1.0` (so the upstream body is close-delimited and p->length is -1: only full buffers or
# the upstream's end release data). nginx hides X-Accel-Buffering from the client
# (`proxy_hide_header` defaults) after honouring it, so strip_header sits client-side.
# http10_upstream sends the request as HTTP/1.0 with `Connection: close`, so the
# upstream answers close-delimited and the buffers count body bytes only, as nginx's do;
# it re-chunks toward the client, client-side of the buffering and upstream-side of gzip.
_NGINX_HTTP10 = """
  - http10_upstream: {}
"""

_NGINX_BUFFERING = (
    _NGINX_HTTP10
    + """
  - proxy_buffering:
      buffer_size: 4KiB
      buffers_size: 4KiB
      proxy_http_version: "1.0"
      postpone_output: 1460
"""
)

# `proxy_read_timeout 60s` between two reads from the upstream: 504 before the head, a
# close without the terminal chunk after it. Server-side of the buffering, because nginx
# re-arms it on every upstream read, not on what reaches the client; lazily, as all its
# event timers (NGX_TIMER_LAZY_DELAY, 300 ms: see faults/idle_reaper.py).
_NGINX_READ_TIMEOUT = """
  - idle_reaper: {timeout: 60s, before_headers: "504", after_headers: close, lazy: 300ms}
"""

_NGINX_HIDE = """
  - strip_header: {headers: [X-Accel-Buffering]}
"""

PRESETS: dict[str, str] = {
    "passthrough": "[]",
    "nginx-default": _NGINX_HIDE + _NGINX_BUFFERING + _NGINX_READ_TIMEOUT,
    # `proxy_buffering off`: ngx_http_upstream_process_non_buffered_request writes each
    # upstream read to the client at once. The upstream leg is still HTTP/1.0
    # (proxy_http_version's default, which the fingerprint of a real nginx with buffering
    # off measures) and proxy_read_timeout still applies.
    "nginx-streaming": _NGINX_HIDE + _NGINX_HTTP10 + _NGINX_READ_TIMEOUT,
    # nginx-default plus `gzip on; gzip_types text/event-stream;` (ngx_http_gzip_module:
    # gzip_buffers 32 4k, gzip_comp_level 1). Under buffering no flush flag reaches the
    # gzip filter, so zlib holds the whole stream: one burst at the end.
    "nginx-gzip": _NGINX_HIDE
    + """
  - gzip_encoding:
      flush: none
      level: 1
      buffer_size: 4KiB
      content_types: [text/html, text/event-stream]
"""
    + _NGINX_BUFFERING
    + _NGINX_READ_TIMEOUT,
    # HAProxy 2.6, `mode http` with the `defaults` Debian ships (timeout connect 5000,
    # client 50000, server 50000). No body buffering, but without `option http-no-delay`
    # (configuration manual, section 4) it sends with MSG_MORE, which Linux treats like
    # TCP_CORK: held until a full MSS (`segment: auto`: the client socket's TCP_MAXSEG,
    # 65,483 on loopback, 1,448 on Ethernet, the fallback) or until the kernel's timer
    # sends it. That timer is the zero-window probe timer (tcp_check_probe_timer arms
    # ICSK_TIME_PROBE0 for max(RTO, TCP_RTO_MIN) when a write leaves data queued and
    # nothing is in flight), so it runs from the first held byte for one RTO: TCP_RTO_MIN
    # (200 ms) plus the smoothed RTT, rounded up to whole jiffies, 51 at Debian's HZ=250:
    # 204 ms, what `ss -ti` shows as `rto:204` on loopback. Measured (docs/calibration.md):
    # a lone MSG_MORE write left 204-217 ms after it; a second one 203 ms after the first
    # joined it every time. A window of 200 ms split every stream whose frames fall on a
    # 200 ms grid (frame 10 of a 20 ms stream, keep-alive comments every 100 ms) one
    # burst earlier than HAProxy did. Without `option abortonclose` a client's FIN after
    # its request is not an abort: HAProxy learns when a write to the client fails, which
    # the cork delays: the first write after the FIN is corked one RTO, and the write
    # after it fails. `timeout server` is an idle timeout on the server side: 504 before
    # the head, a close without the terminal chunk after it.
    "haproxy-default": """
  - coalescer: {direction: downstream, window: 204ms, size: 1448, segment: auto}
  - ignore_client_close: {until: write_fails, cork: 204ms}
  - idle_reaper: {timeout: 50s, before_headers: "504", after_headers: close}
""",
    # Apache httpd 2.4 mod_proxy_http with `ProxyPass` and nothing else: it flushes
    # every read from the backend (a FLUSH bucket when the backend has no more data
    # ready), does not watch the client while relaying, so it learns the client left
    # when a write fails; `ProxyTimeout` defaults to `Timeout`, 300 s in Debian's
    # apache2.conf (60 s compiled in): a close without the terminal chunk after the head.
    # A timeout before the head is a 502 (AH01102 "error reading status line from
    # remote server", then ap_proxyerror's Bad Gateway), not nginx's 504.
    "apache-default": """
  - ignore_client_close: {until: write_fails}
  - idle_reaper: {timeout: 300s, before_headers: "502", after_headers: close, page: apache}
""",
    # Caddy 2.6 `reverse_proxy`: flush_interval -1 for text/event-stream (every write
    # goes out at once), the upstream request is cancelled with the client's, and the
    # http transport sets no read timeout by default. Nothing to inject: a hop that is
    # indistinguishable from none on these measures. With a transport `read_timeout`,
    # Caddy ends a started stream with a clean terminal chunk and no [DONE]: write
    # `idle_reaper: {timeout: ..., after_headers: finish}` after this preset.
    "caddy-default": "[]",
}

# nginx's client timers, on in every nginx unless configured otherwise (ngx_http_core_module
# docs; ngx_http_core_module.c's merge defaults: ngx_http_core_merge_srv_conf's
# client_header_timeout 60000, ngx_http_core_merge_loc_conf's client_body_timeout 60000 and
# keepalive_timeout 75000 ms): `client_header_timeout 60s` for every request head,
# `keepalive_timeout 75s` for an idle kept-alive connection (closed silently),
# `client_body_timeout 60s` between two body reads (408 "Request Time-out"). Each preset
# that models nginx carries them, as each of those nginx runs them.
_NGINX_CLIENT_TIMERS = (
    "{client_header_timeout: 60s, keepalive_timeout: 75s, client_body_timeout: 60s}"
)

PRESET_PROXY: dict[str, str] = {
    "nginx-default": _NGINX_CLIENT_TIMERS,
    "nginx-streaming": _NGINX_CLIENT_TIMERS,
    "nginx-gzip": _NGINX_CLIENT_TIMERS,
}
