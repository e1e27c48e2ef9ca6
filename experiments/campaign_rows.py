"""The fault campaigns' tables: one row per algorithm (and victim), kept across partial campaigns.

A campaign of some algorithms (``--algos``) into a folder refreshes their
rows and keeps the others': every row is kept in ``rows.json`` there, and
``table.md`` is written from all of them.
"""

import json
import os

__all__ = ["final_accuracy", "keep_rows"]


def final_accuracy(run) -> float:
    """The last evaluation's accuracy of ``run`` (a :class:`wagma.results.Run`), NaN without one."""
    return float(run.eval["accuracy"][-1]) if len(run.eval.get("accuracy", ())) else float("nan")


def keep_rows(out_dir, rows, algos, order, render):
    """Merge ``rows`` (of ``algos``) with the other algorithms' rows in
    ``out_dir/rows.json``, sorted by ``order`` (algorithm names) and then
    by victim where rows have one; write ``rows.json`` and ``table.md``
    (``render(rows)``, Markdown) and print the table."""
    kept = os.path.join(out_dir, "rows.json")
    earlier = []
    if os.path.exists(kept):
        with open(kept) as f:
            earlier = [row for row in json.load(f) if row["algorithm"] not in algos]
    rank = {name: k for k, name in enumerate(order)}
    table = sorted(earlier + rows, key=lambda row: (rank.get(row["algorithm"], len(rank)), row.get("victim", "")))
    with open(kept, "w") as f:
        json.dump(table, f, indent=1)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(render(table))
    print("\n" + render(table), flush=True)
