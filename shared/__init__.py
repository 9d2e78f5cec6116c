"""Types and helpers shared by every Hops service, the simulator and the CLI.

Nothing in this package performs I/O except :mod:`shared.specs`, which reads
spec files on request.
"""
