"""The proxy's own nginx behaviour as pure stages: not user faults, never registered.

A real proxy in front of vLLM has timeouts and error pages of its own, whatever the network
around it does. `middlebox/compose.py` builds these stages from a scenario's `proxy:` block
and the server puts them in every connection's pipeline, on the same virtual clock as the
faults (the design's "the shell holds no fault logic"):

- `client_header_timeout`: nginx's `client_header_timeout`, the first request head or a close;
- `proxy_read_timeout`: nginx's `proxy_read_timeout`, the `idle_reaper` fault with the
  proxy's own ends (an RST to a hung upstream, a lingering close after the 504);
- `upstream_unreachable`: nginx's 502 page (or 400) after reading the request head when the
  upstream cannot be reached, or a reset or a close;
- `request_timeouts`: nginx's client timers for every request of a kept-alive connection
  (header, keep-alive idle, body with its 408); on in the nginx presets (their `proxy:`
  block), off elsewhere unless the scenario sets `keepalive_timeout`/`client_body_timeout`;
- `fail_closed` / `fail_closed_response`: a request or an upstream response the framer
  refuses is answered as nginx does (400/405/501; 502 before a response head reached the
  client, a close after it) instead of passing a fault by as raw bytes; an upstream that
  closes before a whole response head gets nginx's 502 too ("upstream prematurely closed
  connection while reading response header from upstream").

Each stage has two flags the relay reads: `connection_closed` (it ended the connection as
nginx's `close()` does, so the relay finishes once its writes are out without waiting for the
peers' FINs) and `finished` (it passes everything through from now on with no deadline, so the
relay drops it and a connection with nothing else in its path takes the pass-through path).
"""
