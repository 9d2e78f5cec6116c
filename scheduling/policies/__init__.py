"""Scheduling policies behind the one ``plan(snapshot)`` protocol (:mod:`scheduling.policy`)."""
