"""Hops profiler service."""
