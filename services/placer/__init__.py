"""The placer service: applies each plan to the cluster (Hops §3.1, step 9),
stops, books and starts jobs (:mod:`services.placer.service`; the pure
decisions in :mod:`services.placer.diff`, :mod:`services.placer.booking` and
:mod:`services.placer.commands`)."""
