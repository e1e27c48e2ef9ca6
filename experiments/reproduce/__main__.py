"""``python -m experiments.reproduce [--only NAME ...] [--full] [--out-dir DIR]``: measure the claims, write
``DIR/REPORT.md``.

Each claim runs its experiments (MPI jobs through the ``mpiexec`` next to
this Python, simulations, models) into ``DIR/reproduce/NAME/``, writes its
rows to ``DIR/reproduce/NAME.h5``, and the report is rewritten from all
claim files present, so a claim that fails loses nothing the others
measured (the exit status is then 1).  The default set takes about 85
minutes on 2 cores; ``--full`` runs the long versions (more ranks, steps,
epochs).
"""

import argparse
import os
import sys
import time
import traceback

from collectives.logs import configure_logging

from ..mpirun import find_mpiexec
from ..options import HelpFormatter
from .claims import CLAIMS
from .context import Context
from .record import write_claim
from .report import claim_file, write_report


def _names(text):
    return [n for n in text.split(",") if n]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.reproduce",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--only",
        action="append",
        type=_names,
        default=None,
        metavar="NAME[,NAME]",
        help="measure only these claims (repeatable): " + ", ".join(c.name for c in CLAIMS),
    )
    parser.add_argument("--full", action="store_true", help="the long versions (hours on 2 cores)")
    parser.add_argument(
        "--out-dir", default="results", help="REPORT.md and reproduce/ (claim files, runs, figures) go here"
    )
    parser.add_argument("--list", action="store_true", help="list the claims and exit")
    args = parser.parse_args(argv)
    configure_logging()
    if args.list:
        for c in CLAIMS:
            print(f"{c.name:18} {c.paper:13} ~{c.minutes:g} min  {c.title}")
        return 0
    known = {c.name: c for c in CLAIMS}
    chosen = [n for group in args.only for n in group] if args.only else list(known)
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen:
        parser.error(f"--only: unknown {', '.join(unknown) or 'nothing given'}; accepted: {', '.join(known)}")
    mpiexec = find_mpiexec()
    if not mpiexec:
        parser.error("no mpiexec found next to this Python or on PATH; set MPIEXEC")
    failed, start = [], time.monotonic()
    for name in dict.fromkeys(chosen):
        claim = known[name]
        print(f"\n=== {name}: {claim.title}", flush=True)
        began = time.monotonic()
        try:
            result = claim.run(Context(os.path.join(args.out_dir, "reproduce", name), args.full, mpiexec))
        except Exception:  # one claim's failure must not lose the others' rows
            traceback.print_exc()
            failed.append(name)
            continue
        write_claim(
            claim_file(args.out_dir, name), name, claim.title, claim.paper, result, time.monotonic() - began, args.full
        )
        for row in result.rows:
            print(f"  {row.claim}: paper {row.paper}, ours {row.shown} -> {row.verdict}", flush=True)
        write_report(args.out_dir)
    path = write_report(args.out_dir)
    print(
        f"\nwrote {path} ({(time.monotonic() - start) / 60:.1f} min)"
        + (f"; failed: {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
