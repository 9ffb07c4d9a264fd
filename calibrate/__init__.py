"""Calibration of the proxy presets against the real proxies (`make calibrate`).

Each preset in `faults.presets` claims to behave like a real hop with its default
config. This package installs nginx, HAProxy, Apache httpd and Caddy from Debian
packages when they are missing, runs each in the foreground on 127.0.0.1 with a
minimal generated config, sends the same vLLM-emulator stream through it and through
`middlebox proxy` with the preset, and compares what a raw client sees (first byte,
first event, bursts, largest gap, how the stream ends under an idle timeout) and what
the upstream sees when the client leaves. It is never part of the test suite: it needs
root for apt-get, real proxy binaries and a few minutes of wall time.

Modules: `upstream` (the emulator, answering HTTP/1.0 requests as uvicorn does),
`probe` (the measuring client), `proxies` (real proxy configs and processes),
`compare` (metrics and tolerances, pure), `suite` (the run and its report), and
`fingerprints` (`python -m calibrate.fingerprints`: `middlebox fingerprint --write --verify`
through lighttpd, Varnish and Squid, which no preset models; docs/fingerprint.md).
"""
