"""Input errors that name the file, row and field, for one clear line at the CLI.

Every reader, spec parser and config loader raises :class:`InputError`; the CLI catches it and
prints ``str(err)`` (no traceback) and exits with status 2.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input (trace file, cluster spec, policy name, config value).

    Args:
        message: what is wrong and what was expected.
        file: path of the offending file, or ``None`` for command-line input.
        row: 1-based data row (the first row after the header is row 1), or ``None``.
        field: column or option name, or ``None``.

    ``str(err)`` is one line: ``FILE, row R, field 'F': message``, omitting the parts that are None.
    """

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None,
                 field: str | None = None) -> None:
        self.message = message
        self.file = file
        self.row = row
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.file is not None:
            where.append(str(self.file))
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        prefix = ", ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message
