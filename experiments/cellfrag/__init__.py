"""Cell fragmentation: HiveD's cells under a stress workload (Figure 8)."""
