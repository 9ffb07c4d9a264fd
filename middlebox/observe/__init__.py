"""observe: what happened on the wire: the connection journal (each leg framed once),
metrics, pcap export.

Rule: imports core and scenario only; no event loop (the shell feeds it).
"""
