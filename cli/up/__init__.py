"""``hops up``: the live system on this machine: the processes
(:mod:`cli.up.stack`), their supervisor (:mod:`cli.up.launcher`), the
credentials they use (:mod:`cli.up.credentials`) and the start-up
(:mod:`cli.up.up`)."""
