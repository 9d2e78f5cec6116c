"""What the experiments share: one simulation run (simrun), its floor, the
plots, the provenance of a result and the markdown tables (suite)."""
