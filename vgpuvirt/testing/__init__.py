"""Helpers for tests and benchmarks (no product code depends on them)."""
