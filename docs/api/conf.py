"""Sphinx configuration of the API reference (``make api``).

Every module of ``collectives`` and ``wagma`` but the command-line ones
(``__main__``), rendered from its docstrings: Google-style sections through
napoleon, the Sphinx roles (``:func:``, ``:class:``...) resolved against the
modules themselves.  The module list is made here, from the files, so a new
module appears without an edit; autosummary writes one page per module into
``generated/`` (git-ignored).
"""

import os
import shutil
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


# A page of its own (not an include): autosummary makes the module pages only from the
# directives of source files, and puts them beside the page that lists them.  The folder is
# made afresh: the page of a module since moved or removed would fail the build with -W.
GENERATED = os.path.join(os.path.dirname(__file__), "generated")
shutil.rmtree(GENERATED, ignore_errors=True)
os.makedirs(GENERATED)
with open(os.path.join(GENERATED, "modules.rst"), "w") as listing:
    listing.write("Modules\n=======\n\n.. autosummary::\n   :toctree: .\n\n" + "".join(f"   {m}\n" for m in _modules()))

project = "wagma-collectives"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon"]
autosummary_generate = True
templates_path = ["_templates"]
# Each object on the page of the module that defines it, once: "ignore-module-all" keeps a package's
# ``__all__`` re-exports (documented on their own module's page) off the package's page, and
# "undoc-members" documents every public member that autosummary's tables list, docstring or not.
autodoc_default_options = {"members": True, "undoc-members": True, "ignore-module-all": True, "show-inheritance": True}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# The algorithms' "Options:" sections list their options as "Args:" lists its arguments.
napoleon_custom_sections = [("Options", "params_style")]
html_theme = "alabaster"

# Names of other projects (the standard library, numpy, torch, mpi4py, h5py, pandas), mostly from type
# hints: they would resolve through intersphinx, but its inventories come from the network, and the build
# must work offline.  So they are not checked; every name of collectives and wagma is.  An annotation that
# cannot be evaluated (a name imported for type checkers alone) is shown as written: hence ``MPI.`` for
# ``from mpi4py import MPI``, and a standard-library class imported by its own name.
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|torch|mpi4py|MPI|h5py|pandas)(\..*)?"),
    (r"py:.*", r"(argparse|collections|contextlib|dataclasses|hmac|inspect|os|secrets|signal)\..*"),
    (r"py:.*", r"(functools|subprocess|threading)\..*"),
    (r"py:.*", r"AbstractContextManager"),
]


def _skip_command_lines(app, what, name, obj, skip, options):
    """A package's ``__main__`` is its command line: importing it would run it."""
    return True if name.split(".")[-1] == "__main__" else None


def setup(app):
    app.connect("autodoc-skip-member", _skip_command_lines)
