"""Hops estimator service."""
