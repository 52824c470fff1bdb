"""Benchmarks: they print figures and are never part of the test suite."""
