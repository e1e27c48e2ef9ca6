"""The rows of a Markdown table whose first cell names paths, for the tests that hold a doc to the files."""

import re
from pathlib import Path

#: Text in backquotes: the paths a row's first cell names.
CODE = re.compile(r"`([^`]+)`")


def cells(line: str) -> list[str]:
    """The cells of a Markdown table row (the pipes at both ends dropped)."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def path_rows(path: Path) -> list[tuple[int, list[str], list[str]]]:
    """``(line number, paths, cells)`` for each table row of the file at
    ``path`` whose first cell names something in backquotes (a header and
    its separator name nothing)."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("| "):
            row = cells(line)
            named = CODE.findall(row[0])
            if named:
                rows.append((number, named, row))
    return rows
