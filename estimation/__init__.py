"""The multi-layer estimator (Hops §3.3-3.5), pure: :mod:`services.estimator`
serves it over NATS."""
