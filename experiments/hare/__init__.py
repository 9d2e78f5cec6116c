"""Hare: task-level scheduling on its own simulator, beside Hops and Gavel (docs/hare.md)."""
