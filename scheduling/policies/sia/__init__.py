"""The Sia baseline (Jayaram Subramanya et al., SOSP'23)."""
