"""The monitor service: nodes, heartbeats and deadlines, the release of a job's
resources when it ends (Hops §3.1), and the Prometheus metrics
(:mod:`services.monitor.service`)."""
