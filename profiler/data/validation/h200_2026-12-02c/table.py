"""Every validation of this directory (validate.sh's) as one markdown table: python
profiler/data/validation/h200_2026-12-02c/table.py (writes table.md beside it), which runs
profiler/validation/table.py over this directory's workloads."""
import subprocess
import sys

subprocess.run([sys.executable, "profiler/validation/table.py", "profiler/data/validation/h200_2026-12-02c", "A, machine 1=A",
                "B, machine 1=B", "A, machine 2=machine2/A"], check=True)
