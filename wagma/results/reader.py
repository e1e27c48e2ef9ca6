"""Reading a run file, complete or partial, into memory."""

import json
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from .schema import LATER_STEP_FIELDS, SCHEMA, STEP_FIELDS
from .summary import summarize

__all__ = ["Run", "load_run"]


@dataclass
class Run:
    """A run file's content: attributes, the written steps, evaluations, summary."""

    path: str
    attrs: dict[str, Any]
    steps: dict[str, np.ndarray] = field(default_factory=dict)  # field -> (P, written) array
    eval: dict[str, np.ndarray] = field(default_factory=dict)  # field -> (E,) array
    summary: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, np.ndarray] = field(default_factory=dict)  # sync/<name> by name -> array (rounds, stragglers)

    @property
    def config(self) -> dict[str, Any]:
        return json.loads(self.attrs.get("config", "{}"))


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_run(path: str) -> Run:
    """Read a run file (complete or partial) into memory; the summary is
    :func:`~wagma.results.summary.summarize`'s, with the stored one's values where present."""
    with h5py.File(path, "r") as f:
        if f.attrs.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a run file of schema {SCHEMA!r} (got {f.attrs.get('schema')!r})")
        attrs = {k: _plain(v) for k, v in f.attrs.items()}
        written = int(f["steps"].attrs["written"])
        steps = {k: f["steps"][k][:, :written] for k in STEP_FIELDS if k in f["steps"]}
        for name, default in LATER_STEP_FIELDS.items():
            if name not in steps:
                steps[name] = np.full_like(steps["clock"], default(attrs))
        evals = {k: f["eval"][k][:] for k in f["eval"]}
        tables = {k: f["sync"][k][:] for k in f["sync"]} if "sync" in f else {}
        stored = {k: _plain(v) for k, v in f["summary"].attrs.items()} if "summary" in f else {}
    run = Run(path, attrs, steps, evals, tables=tables)
    run.summary = {**summarize(run), **stored}
    return run
