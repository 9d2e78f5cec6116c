"""The in-job library: what a user's training script imports to run under
Hops (:mod:`hops.plugin`). The command line is :mod:`cli`, the experiments
:mod:`experiments`; this package imports none of them, only the job contract
of :mod:`shared` (pyproject.toml, the ``plugin`` import contract)."""
