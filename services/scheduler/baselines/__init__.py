"""Baseline policies (Sia, Gavel) behind the same ``plan(snapshot)`` protocol as Hops."""
