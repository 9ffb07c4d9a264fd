"""Public conformance vectors (../shared/conformance/, never copied here) run through the
framers: every split byte-exact and split-invariant, verdicts as documented."""
