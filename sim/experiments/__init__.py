"""sim/experiments."""
