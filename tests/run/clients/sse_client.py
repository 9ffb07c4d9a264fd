"""A tiny stdlib client under the middlebox contract, for the run tests (drills, views).

`python sse_client.py trusting` shows whatever arrived and reports success when the
stream simply ends (like `curl -N`); `python sse_client.py careful` reports an error
unless it saw `data: [DONE]` (the fix a drill's trainee makes). Sequential requests,
no retries; http.client only, so it starts fast.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from urllib.parse import urlsplit


def run_one(base: str, request: dict, careful: bool) -> dict:
    url = urlsplit(base)
    path = url.path.rstrip("/") + (
        "/chat/completions" if request["endpoint"] == "chat" else "/completions"
    )
    started = time.time()
    out = {"index": request["index"], "text": "", "chunks": [], "started_at": started,
           "finish_reason": None, "error": None, "usage": None, "attempts": 1, "resumes": 0,
           "saw_done": False, "abandoned": False}  # fmt: skip
    try:
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
        connection.request(
            "POST",
            path,
            json.dumps(request["body"]),
            {"Content-Type": "application/json",
             "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'EMPTY')}"},
        )  # fmt: skip
        response = connection.getresponse()
        if response.status != 200:
            out["error"] = f"HTTPError: {response.status}"
            return out
        while True:
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                out["saw_done"] = True
                break
            event = json.loads(data)
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                if piece:
                    out["text"] += piece
                    out["chunks"].append([time.time(), piece])
                out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
        if careful and not out["saw_done"]:
            out["error"] = "TruncatedStream: the stream ended without data: [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as error:
        out["error"] = f"{type(error).__name__}: {error}"
    finally:
        out["ended_at"] = time.time()
    return out


def main() -> None:
    careful = sys.argv[1:] == ["careful"]
    with open(os.environ["MIDDLEBOX_WORKLOAD"]) as file:
        workload = json.load(file)
    base = os.environ["OPENAI_BASE_URL"]
    results = [run_one(base, request, careful) for request in workload["requests"]]
    target = os.environ["MIDDLEBOX_RESULT"]
    with open(target + ".tmp", "w") as out:
        json.dump({"client": "careful" if careful else "trusting", "results": results}, out)
    os.replace(target + ".tmp", target)


if __name__ == "__main__":
    main()
