"""shell: the thin trio I/O shell: sockets, the read hub, the relay driver, the server,
worker processes and the control API.

Rule: trio only (never aiohttp); imports core, scenario and observe; holds no fault logic
(every timing decision is a pure stage on the virtual clock).
"""
