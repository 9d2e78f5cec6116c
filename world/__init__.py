"""The world model: what the cluster and its jobs really do, which no scheduler sees.

The model catalog (:mod:`world.catalog`), the ground truth of throughputs and
profiling runs (:mod:`world.truth`) and the built-in clusters
(:mod:`world.clusters`), with their packaged data under ``world/data/``. The
simulator and the emulated executors both import it, so the two advance a job
at the same true rate; neither owns it. Pure: it reads its packaged data files
when first asked and takes its randomness from the generator it is given.
"""
