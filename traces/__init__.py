"""Trace readers, LoRA attribute assignment, synthetic workloads and trace summaries.

Entry points (all import without torch):

- :func:`read_trace` (``FORMAT:PATH``; formats acme, csv, itp, philly, slurm, synthetic) -> common trace table
  (:mod:`tlora_sim.traces.frame`: ``job_id, submit_time_s, duration_s, num_gpus, tenant``), :func:`validate_frame`,
  :func:`parse_column_mapping` (``--columns`` for the csv format).
- :func:`assign_lora`, :class:`LoraDistribution`, :func:`load_distribution` (:mod:`tlora_sim.traces.lora`).
- :func:`generate_synthetic` (:mod:`tlora_sim.traces.synthetic`), :func:`describe_trace`, :func:`format_description`.
- :func:`apply_window` (:mod:`tlora_sim.traces.window`: ``window``, ``first_jobs``, ``arrival_scale``),
  :func:`from_dataframe` (:mod:`tlora_sim.traces.dataframe`), :data:`TRACE_ATTRS` (LoRA attributes a trace
  may give, :mod:`tlora_sim.traces.job_attrs`).

Reading rules (what is skipped, what raises) are listed in ``traces/README.md``.
"""

from tlora_sim.traces.describe import describe_trace, format_description
from tlora_sim.traces.frame import COLUMNS, validate_frame
from tlora_sim.traces.dataframe import from_dataframe
from tlora_sim.traces.generic_csv import parse_column_mapping
from tlora_sim.traces.job_attrs import TRACE_ATTRS
from tlora_sim.traces.lora import DISTRIBUTIONS, LoraDistribution, assign_lora, load_distribution
from tlora_sim.traces.registry import known_formats, read_trace
from tlora_sim.traces.synthetic import generate_synthetic
from tlora_sim.traces.window import apply_window

__all__ = ["COLUMNS", "DISTRIBUTIONS", "LoraDistribution", "TRACE_ATTRS", "apply_window", "from_dataframe", "assign_lora", "describe_trace", "format_description",
           "generate_synthetic", "known_formats", "load_distribution", "parse_column_mapping", "read_trace",
           "validate_frame"]
