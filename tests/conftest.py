"""Settings for the whole suite: property tests are deterministic and never timed.

Hypothesis draws its examples from a fresh random seed each run and fails an example that
takes over 200 ms; on this shared 2-core machine (and a busy CI runner) that turns load into
failures, and a fresh seed each run makes a failure unrepeatable. The suite's rule is that
tests are deterministic and assert nothing about wall-clock time, so the profile derandomizes
(the examples follow from each test's own source) and turns the deadline off.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("middlebox", deadline=None, derandomize=True, database=None)
settings.load_profile("middlebox")
