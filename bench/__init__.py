"""Benchmarks: `python -m bench.scheduler` (issue: swap-minimizing scheduler) and others; see bench/RESULTS.md."""
