"""Benchmarks of the suite itself: run time per backend and time to catch planted bugs."""
