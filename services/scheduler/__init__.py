"""Hops scheduler service."""
