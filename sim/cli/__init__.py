"""sim/cli."""
