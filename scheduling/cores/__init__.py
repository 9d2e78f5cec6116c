"""CODA's CPU side: the adaptive core allocator and the contention eliminator."""
