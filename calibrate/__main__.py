"""`python -m calibrate`: run every preset against its real proxy; exit 1 on disagreement."""

from __future__ import annotations

import sys

from calibrate.suite import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
