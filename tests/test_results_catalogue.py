"""results/README.md is a catalogue a reader can trust: nothing under results/ unexplained, nothing listed that is gone.

The README's table has one row per result set: the set's paths (relative to
results/, folders ending in ``/``), what it shows, the command that writes it
again, and the files that cite it.  These tests hold the table and the folder
to each other: every top-level entry of results/ is named by exactly one row,
every path a row names exists, every file under results/ lies in exactly one
listed set, every row links to at least one existing file that names its set,
and every row gives a command.
"""

import os
import re
from pathlib import Path

import pytest
from markdown_tables import CODE, path_rows

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
README = RESULTS / "README.md"
COLUMNS = ("set", "what it shows", "command", "cited by")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _rows():
    """``[(line number, paths, cells)]`` for each row of the README's table
    whose first cell names paths in backquotes (the header and the separator
    have none)."""
    rows = path_rows(README)
    for number, paths, cells in rows:
        assert len(cells) == len(COLUMNS), (
            f"results/README.md:{number}: {len(cells)} cells, expected {len(COLUMNS)} "
            f"({', '.join(COLUMNS)}): {', '.join(paths)}"
        )
    assert rows, "results/README.md has no table rows naming result sets"
    return rows


@pytest.fixture(scope="module")
def rows():
    return _rows()


def _top_level():
    """The entries at the top of results/, the catalogue itself and caches left out."""
    return sorted(name for name in os.listdir(RESULTS) if name not in ("README.md", "__pycache__"))


def _files():
    """Every file under results/ (relative, with ``/``), README.md and ``__pycache__`` left out."""
    found = []
    for top, dirs, names in os.walk(RESULTS):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in names:
            path = Path(top, name).relative_to(RESULTS).as_posix()
            if path != "README.md":
                found.append(path)
    return sorted(found)


def _mentions(text, paths):
    """Whether ``text`` names one of a row's sets: ``results/NAME`` not followed
    by more of a name (so ``results/sweep`` does not count for
    ``results/sweep-repeats``); the reproduction report by ``REPORT.md``."""
    for path in paths:
        name = path.rstrip("/")
        if name == "REPORT.md" and "REPORT.md" in text:
            return True
        if re.search(r"results/" + re.escape(name) + r"(?![\w-])", text):
            return True
    return False


def test_every_top_level_entry_is_named_by_exactly_one_row(rows):
    named = {}
    for number, paths, _ in rows:
        for path in paths:
            named.setdefault(path.rstrip("/").split("/")[0], []).append(number)
    missing = [name for name in _top_level() if name not in named]
    assert not missing, f"results/ entries no row of results/README.md names: {', '.join(missing)}"
    twice = {name: lines for name, lines in named.items() if len(lines) > 1}
    assert not twice, "results/ entries named by more than one row (README.md lines): " + ", ".join(
        f"{name} ({', '.join(map(str, lines))})" for name, lines in sorted(twice.items())
    )


def test_every_listed_path_exists(rows):
    gone = []
    for number, paths, _ in rows:
        for path in paths:
            target = RESULTS / path
            exists = target.is_dir() if path.endswith("/") else target.is_file()
            if not exists:
                gone.append(f"results/{path} (line {number})")
    assert not gone, f"paths results/README.md lists that do not exist: {', '.join(gone)}"


def test_every_file_lies_in_exactly_one_listed_set(rows):
    sets = [path for _, paths, _ in rows for path in paths]

    def holders(path):
        return [s for s in sets if (path.startswith(s) if s.endswith("/") else path == s)]

    stray = [f"results/{path}" for path in _files() if not holders(path)]
    assert not stray, f"files under results/ in no set of results/README.md: {', '.join(stray)}"
    shared = [f"results/{path} ({', '.join(holders(path))})" for path in _files() if len(holders(path)) > 1]
    assert not shared, f"files under results/ in more than one listed set: {', '.join(shared)}"


def test_every_row_is_cited_by_existing_files_that_name_it(rows):
    problems = []
    for number, paths, cells in rows:
        sets = ", ".join(paths)
        links = LINK.findall(cells[COLUMNS.index("cited by")])
        if not links:
            problems.append(f"{sets} (line {number}): no link in 'cited by'")
        for link in links:
            target = (RESULTS / link.split("#")[0]).resolve()
            shown = os.path.relpath(target, ROOT)
            if not target.is_file():
                problems.append(f"{sets} (line {number}): {shown} does not exist")
            elif not _mentions(target.read_text(errors="replace"), paths):
                problems.append(f"{sets} (line {number}): {shown} does not name the set")
    assert not problems, "results/README.md's citations: " + "; ".join(problems)


def test_every_row_gives_a_command(rows):
    missing = [
        f"{', '.join(paths)} (line {number})"
        for number, paths, cells in rows
        if not CODE.search(cells[COLUMNS.index("command")])
    ]
    assert not missing, f"rows of results/README.md without a command in backquotes: {', '.join(missing)}"
