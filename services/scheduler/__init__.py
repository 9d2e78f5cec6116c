"""The scheduler service: admission on every replica (:mod:`.admission`),
the leader lease (:mod:`.election`) and the leader's rounds (:mod:`.leader`),
a thin asyncio shell over the pure decisions of :mod:`scheduling.live`."""
