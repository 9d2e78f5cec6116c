"""The Gavel baseline (Narayanan et al., OSDI'20)."""
