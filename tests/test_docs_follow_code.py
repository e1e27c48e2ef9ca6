"""The docs follow the code: a module, or an option, added, moved or removed
without its documentation fails here.

docs/layout.md is the map a newcomer reads first: it names every module of
the three packages, and every path it names exists.  docs/algorithms.md
(with fault-tolerance.md and stragglar.md, which take over EnsembleSync and
``sync``) names every algorithm and every one of its options, as they are
defined once in :mod:`wagma.options.algorithms`."""

import dataclasses
import re
from pathlib import Path

from markdown_tables import path_rows

from wagma.algorithms import ALGORITHMS

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"
PACKAGES = ("collectives", "wagma", "experiments")


def _rows():
    """``(paths, what)`` for each row of docs/layout.md's tables: the paths its first cell names."""
    return [(paths, " | ".join(cells[1:])) for _, paths, cells in path_rows(LAYOUT)]


def _modules():
    """Every module of the packages, package initialisers and ``__main__`` left out."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name not in ("__init__.py", "__main__.py"):
                yield path.relative_to(ROOT).as_posix()


def test_every_module_has_a_row():
    rows = list(_rows())
    missing = []
    for module in _modules():
        folder = module.rsplit("/", 1)[0] + "/"
        name = Path(module).name
        # A module's row names its path; or its folder's row stands for it (a subpackage
        # described as a whole); or a row about a sibling module names its file.
        if not any(
            module in paths or folder in paths or (name in what and any(path.startswith(folder) for path in paths))
            for paths, what in rows
        ):
            missing.append(module)
    assert not missing, "docs/layout.md has no row for:\n" + "\n".join(missing)


def test_every_named_path_exists():
    stale = [
        path
        for paths, _ in _rows()
        for path in paths
        if "/" in path and not path.startswith("runs/") and not (ROOT / path).exists()
    ]
    assert not stale, "docs/layout.md names paths that do not exist:\n" + "\n".join(stale)


ALGORITHM_DOCS = ("algorithms.md", "fault-tolerance.md", "stragglar.md")


def test_every_algorithm_and_option_is_documented():
    text = "".join((ROOT / "docs" / name).read_text() for name in ALGORITHM_DOCS)
    missing = [
        f"{name}: {option}"
        for name, cls in ALGORITHMS.items()
        for option in [name, *(f.name for f in dataclasses.fields(cls.Options))]
        # An option appears as `option` or `option=...` (the Python keyword) or --option (the
        # command line's flag), whole: `period` is not named by `period_group_size_dict`.
        if not re.search(rf"`{option}[`=]|--{option.replace('_', '-')}\b(?!-)", text)
    ]
    assert not missing, f"not named in docs/{', docs/'.join(ALGORITHM_DOCS)}:\n" + "\n".join(missing)
