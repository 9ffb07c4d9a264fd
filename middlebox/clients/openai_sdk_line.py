"""`openai-v1`, `openai-v2`: the `openai` client's driver under an older SDK line.

The same driver as `openai` (`middlebox.clients.openai_sdk`: `AsyncOpenAI()` with its
defaults, deltas reassembled, exceptions surfaced), run by the Python of the client's own
environment (`middlebox.clients.envs`), which holds the 1.x or 2.x release pinned in its
lock file. The lines differ in what they raise: 1.x and 2.x let httpx's own exceptions
(`RemoteProtocolError`, `ReadError`) escape a broken stream, where 3.x wraps them in
`APIConnectionError`. The client's name is the first argument.
"""

from __future__ import annotations

import sys

from middlebox.clients.contract import run_client
from middlebox.clients.openai_sdk import session


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return run_client(args[0] if args else "openai-line", session)


if __name__ == "__main__":
    raise SystemExit(main())
