"""Trace readers, LoRA attribute assignment, synthetic workloads and trace summaries.

Entry points (all import without torch):

- :func:`read_trace` (``FORMAT:PATH``; formats acme, csv, itp, philly, synthetic) -> common trace table
  (:mod:`traces.frame`: ``job_id, submit_time_s, duration_s, num_gpus, tenant``), :func:`validate_frame`,
  :func:`parse_column_mapping` (``--columns`` for the csv format).
- :func:`assign_lora`, :class:`LoraDistribution`, :func:`load_distribution` (:mod:`traces.lora`).
- :func:`generate_synthetic` (:mod:`traces.synthetic`), :func:`describe_trace`, :func:`format_description`.

Reading rules (what is skipped, what raises) are listed in ``traces/README.md``.
"""

from traces.describe import describe_trace, format_description
from traces.frame import COLUMNS, validate_frame
from traces.generic_csv import parse_column_mapping
from traces.lora import DISTRIBUTIONS, LoraDistribution, assign_lora, load_distribution
from traces.registry import known_formats, read_trace
from traces.synthetic import generate_synthetic

__all__ = ["COLUMNS", "DISTRIBUTIONS", "LoraDistribution", "assign_lora", "describe_trace", "format_description",
           "generate_synthetic", "known_formats", "load_distribution", "parse_column_mapping", "read_trace",
           "validate_frame"]
