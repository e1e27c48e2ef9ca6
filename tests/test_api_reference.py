"""The API reference builds clean: every role in the docstrings of ``collectives``
and ``wagma`` (``:func:``, ``:class:``, ``:meth:``, ``:attr:``, ``:data:``,
``:mod:``...) resolves to an object the reference documents, and every
docstring parses (napoleon's Google sections, then reStructuredText), so the
rendered reference has no broken link and no garbled paragraph.

Sphinx runs the configuration of ``make api`` (docs/api/conf.py: one page per
module, generated into docs/api/generated/) with warnings as errors and
nitpicky, but with the dummy builder: it reads and resolves everything and
writes nothing, so it costs what the check needs.  ``make api`` builds the
same reference as HTML into runs/api/index.html.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "docs" / "api" / "generated"
# A few modules whose pages must be there: the top of each package, moved and split ones.
PAGES = ("collectives", "collectives.schedules.blocking", "wagma", "wagma.results.recorder")


def test_api_reference_builds_without_a_warning(tmp_path):
    command = [sys.executable, "-m", "sphinx", "-b", "dummy", "-W", "-n", "--keep-going", "-q"]
    command += ["-d", str(tmp_path / "doctrees"), "docs/api", str(tmp_path / "out")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    status, said = result.returncode, result.stderr
    assert status == 0, f"Sphinx (exit status {status}) says:\n{said}"
    # Generated, and read by this build (a page left by an earlier build has no doctree here).
    missing = [
        name
        for name in PAGES
        if not (GENERATED / f"{name}.rst").is_file()
        or not (tmp_path / "doctrees" / "generated" / f"{name}.doctree").is_file()
    ]
    assert not missing, f"no page generated in {GENERATED} for: {', '.join(missing)}"
