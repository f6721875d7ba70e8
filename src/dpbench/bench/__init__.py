"""Benchmarks of dpbench itself: each variant's step in dpbench against a bare loop of the same
variant (the harness must cost nothing a user's own loop would not)."""
