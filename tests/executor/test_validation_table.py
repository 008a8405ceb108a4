"""``profiler/validation/table.py``: the markdown table of a validation directory's validate-run
outputs, rebuilt from the committed 2026-12-02b and 2026-12-02c validations byte for byte, and its
refusal of a part that names no subdirectory."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "profiler" / "validation" / "table.py"
V = ROOT / "profiler" / "data" / "validation"


@pytest.mark.parametrize("session,last", [("h200_2026-12-02b", "B, machine 2=machine2/B"),
                                          ("h200_2026-12-02c", "A, machine 2=machine2/A")])
def test_the_committed_tables_are_what_the_tool_writes(tmp_path, session, last):
    if not (V / session / "table.md").is_file():
        pytest.skip(f"{V / session} absent")
    mod = runpy.run_path(str(TOOL))
    parts = [("A, machine 1", "A"), ("B, machine 1", "B"), tuple(last.split("="))]
    text = mod["table"](V / session, parts)
    assert text + "\n" == (V / session / "table.md").read_text()
    assert "calibrated (of record)" in text.splitlines()[2]  # the one of record first


def test_a_part_without_its_subdirectory_is_refused(tmp_path, capsys):
    mod = runpy.run_path(str(TOOL))
    with pytest.raises(SystemExit) as e:
        mod["main"]([str(tmp_path), "A=nosuch"])
    assert e.value.code == 2 and "LABEL=SUBDIR" in capsys.readouterr().err
    assert not (tmp_path / "table.md").exists()
