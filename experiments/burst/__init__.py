"""A burst of short jobs while long jobs run (issue 33 item 2), in the
simulator: the live bench's scenario (bench/live_burst.py) at any size."""
