"""The estimator service: the multi-layer throughput database (Hops §3.3-3.5)
fed by the samples stream and answering estimate requests
(:mod:`services.estimator.service`)."""
