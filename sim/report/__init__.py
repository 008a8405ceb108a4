"""sim/report."""
