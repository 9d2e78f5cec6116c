"""The Hops policy (Hops §3.6): priorities, service window, the prior-weighted ILP."""
