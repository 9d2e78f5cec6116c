"""Layers: policies that wrap an inner policy (docs/design.md, "Policy layers")."""
