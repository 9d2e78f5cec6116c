"""The scheduling core (pure: no I/O, no clock, no event loop).

``policy`` is the one protocol; ``registry`` resolves policies by name;
``policies/`` holds Hops, Sia and Gavel; ``layers/`` wraps a policy;
``lifecycle`` is the one job state machine; ``live/`` is the live
scheduler's pure decisions, which ``services/scheduler`` drives over NATS.
"""
