"""CODA: CPU jobs beside GPU jobs, cores and memory bandwidth (docs/coda.md)."""
