"""Hops monitor service."""
