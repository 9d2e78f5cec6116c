"""The Themis baseline (Mahajan et al., NSDI'20): finish-time fairness by auction."""
