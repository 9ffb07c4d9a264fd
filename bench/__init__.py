"""middlebox's benchmarks: `make bench` (`python -m bench`), never part of `make test`.

The method and the baselines come from shared/reference/performance-anchors.md; the
results go to bench/results.json and the generated part of docs/performance.md.
"""
