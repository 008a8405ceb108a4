"""sim/core."""
