"""core: the pure data model and framers (stream items, the fault contract, HTTP/1.1 and SSE
framing, nginx-shaped responses).

Rule: imports only the standard library and itself; no event loop, socket, wall clock or global
`random`. mypy strict.
"""
