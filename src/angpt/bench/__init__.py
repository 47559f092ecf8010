"""Benchmarks behind `angpt bench`: side-by-side timings in one process, reported as ratios."""
