"""The live scheduler's decisions without I/O: admission, the leader lease,
the round clock, job records, the snapshot and the tenants' feed.
:mod:`services.scheduler` is the asyncio shell around them."""
