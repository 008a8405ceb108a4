"""sim/costmodel."""
