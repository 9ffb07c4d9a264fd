"""console: the live web console a proxy serves on `--ui HOST:PORT` (docs/ui.md).

A bounded live model of connections and streams fed by the relay's observer contract and the
fault sink, a pure classifier that names what a stream shows (buffering, coalescing, a stall,
a cut, a lost cancellation), and a small trio HTTP server for the page, its live feed (SSE)
and the control API's `/faults` routes behind the control API's authorisation.

Rule: imports core, scenario, observe, report and shell; nothing below imports it (the run
room composes it into `middlebox proxy`). The page is static package data: no build step, no
CDN.
"""
