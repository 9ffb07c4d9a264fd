"""The fault library's helpers, one module per concern (pure; none is a fault).

- `checks`: configuration checks (positive numbers, choices, header field names).
- `items`: cutting and joining chunks.
- `timing`: windows, delay lines, serializers and backpressure for link faults.
- `events`: counting SSE events.
- `triggers`: fire once at a time, after N bytes or after the Nth SSE event, tool-call
  fragment or reasoning token (what an event carries: `middlebox.core.dialects`).
- `match`: which requests an HTTP fault affects, and its view of the HTTP flow.
- `heads`: rewriting heads (strip_header, set_header).
- `sse_edit`: editing an event stream in place, keeping the chunked framing honest.
- `ends`: how a proxy ends a response it gives up on (nginx's 502/504, truncation).
"""
