"""`browser-tls`: the `browser` page (fetch() streaming in headless Chromium) against a TLS
proxy, so Chromium's own HTTP/2 and HTTP/1.1 stacks are what is measured.

Chromium must trust middlebox's local CA (docs/tls-http2.md). A throwaway profile cannot
import a CA without NSS tools, so the page runs with `--ignore-certificate-errors` when the
runner names a CA (`MIDDLEBOX_CA_FILE`, set for `proxy: {tls: ...}` scenarios): the
certificate check is the one thing this client does not model. Everything else is the
browser's: ALPN picks `h2` when the proxy offers it (every request a stream of one
connection), else HTTP/1.1 with Chromium's cap of six connections per origin (the seventh
and eighth requests queue inside the browser). Its control page is served from another
origin, so the cap counts only the proxy's connections.
"""

from __future__ import annotations

import os

from middlebox.clients import browser
from middlebox.clients.contract import run_client

TRUST_FLAG = "--ignore-certificate-errors"


def main() -> int:
    if os.environ.get("MIDDLEBOX_CA_FILE") and TRUST_FLAG not in browser.CHROMIUM_FLAGS:
        browser.CHROMIUM_FLAGS.append(TRUST_FLAG)
    return run_client("browser-tls", browser.session, self_timed=True)


if __name__ == "__main__":
    raise SystemExit(main())
