"""The Tiresias baseline (Gu et al., NSDI'19): discretised 2D-LAS."""
