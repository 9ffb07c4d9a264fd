"""Named presets: the faults that together behave like a real hop with its default config.

`- preset: nginx-default` in a scenario's path expands to the list below. Each preset is
calibrated side by side against the real proxy (`make calibrate`, docs/calibration.md);
until a preset's calibration lands it holds only the parts that are certain.
"""

from __future__ import annotations

PRESETS: dict[str, str] = {
    "passthrough": "[]",
}
