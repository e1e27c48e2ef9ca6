"""Sphinx configuration of the API reference (``make api``).

Every module of ``collectives`` and ``wagma`` but the command-line ones
(``__main__``), rendered from its docstrings: Google-style sections through
napoleon, the Sphinx roles (``:func:``, ``:class:``...) resolved against the
modules themselves.  The module list is made here, from the files, so a new
module appears without an edit; autosummary writes one page per module into
``generated/`` (git-ignored).
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
PACKAGES = ("collectives", "wagma")


def _modules():
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py") and name != "__main__.py":
                    path = os.path.relpath(os.path.join(folder, name), ROOT)[:-3]
                    yield path.removesuffix("/__init__").replace(os.sep, ".")


os.makedirs(os.path.join(os.path.dirname(__file__), "generated"), exist_ok=True)
with open(os.path.join(os.path.dirname(__file__), "generated", "modules.txt"), "w") as listing:
    listing.write(".. autosummary::\n   :toctree: .\n\n" + "".join(f"   {m}\n" for m in _modules()))

project = "wagma-collectives"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon"]
autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"


def _skip_command_lines(app, what, name, obj, skip, options):
    """A package's ``__main__`` is its command line: importing it would run it."""
    return True if name.split(".")[-1] == "__main__" else None


def setup(app):
    app.connect("autodoc-skip-member", _skip_command_lines)
