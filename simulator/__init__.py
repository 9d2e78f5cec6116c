"""Trace-driven simulator: a virtual clock around the same scheduling core the services run."""
