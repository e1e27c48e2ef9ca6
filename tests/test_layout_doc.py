"""docs/layout.md is the map a newcomer reads first: it names every module of
the three packages, and every path it names exists.  A module added, moved or
removed without its row fails here, so the map cannot drift from the code."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"
PACKAGES = ("collectives", "wagma", "experiments")
# A table row: its first cell holds one or more backquoted paths.
ROW = re.compile(r"^\| (.+?) \| (.*) \|$")
PATH = re.compile(r"`([\w./-]+)`")


def _rows():
    for line in LAYOUT.read_text().splitlines():
        match = ROW.match(line)
        if match and match.group(1) != "path":
            yield PATH.findall(match.group(1)), match.group(2)


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
