"""The ``hops`` command (:mod:`cli.main`), its gateway client and, in
:mod:`cli.up`, the local stack that ``hops up`` runs."""
