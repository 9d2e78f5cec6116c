"""Hops placer service."""
