"""sim/runtime: process concerns shared by the report, the experiments and the executor.

``signals`` (SIGINT/SIGTERM/SIGHUP as an exception, held during commits, re-delivered out of
finalizers), ``atomic`` (atomic file writes), ``outlock`` (the output-directory lock and the
sweep's lock, both ``filelock``), ``write_errors`` (an ``OSError`` of writing as one line),
``pool`` (the worker pool of ``compare`` and ``sweep``). They import nothing of the project but
``traces.errors``.
"""
