"""A stand-in for a page watching the console: reads `GET /feed` (SSE) and, as the page does,
asks for the newest stream's detail after each update; on SIGTERM writes what it received
(updates, seconds, bytes, detail requests) as JSON to the file named on its command line.

`python -m bench.feed_consumer HOST PORT OUT.json`
"""

from __future__ import annotations

import http.client
import json
import signal
import sys
import time
from pathlib import Path
from types import FrameType


def main() -> int:
    host, port, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    started = time.monotonic()
    stats = {"updates": 0, "bytes": 0, "details": 0}

    def stop(_signal: int, _frame: FrameType | None) -> None:
        stats["seconds"] = round(time.monotonic() - started, 3)
        out.write_text(json.dumps(stats))
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    feed = http.client.HTTPConnection(host, port, timeout=60)
    feed.request("GET", "/feed")
    answer = feed.getresponse()
    detail = http.client.HTTPConnection(host, port, timeout=60)
    event = ""
    while True:
        line = answer.readline()
        if not line:
            break
        stats["bytes"] += len(line)
        if line.startswith(b"event: "):
            event = line[7:].strip().decode()
        elif line.startswith(b"data: ") and event == "update":
            stats["updates"] += 1
            connections = json.loads(line[6:])["connections"]
            if connections:
                detail.request("GET", f"/api/streams/{connections[0]['id']}")
                detail.getresponse().read()
                stats["details"] += 1
    stop(0, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
