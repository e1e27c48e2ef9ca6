"""The layers stay strict: ``collectives`` imports neither ``wagma`` nor torch
at import time, and ``wagma`` never imports ``experiments``."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imported(path):
    """Top-level package names of every import statement in ``path``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package, forbidden", [("wagma", {"experiments"}), ("collectives", {"wagma", "experiments"})])
def test_no_module_imports_a_higher_layer(package, forbidden):
    offenders = {
        str(p.relative_to(ROOT)): sorted(_imported(p) & forbidden)
        for p in (ROOT / package).rglob("*.py")
        if _imported(p) & forbidden
    }
    assert offenders == {}


def test_importing_collectives_loads_neither_torch_nor_wagma():
    code = (
        "import sys, collectives, collectives.stragglar.training_sync, collectives.stragglar; "
        "print(sorted(m for m in ('torch', 'wagma', 'experiments') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
