"""Command line for run files: ``complete``, which closes the run file of a job that died.

``python -m wagma.results complete PATH [--status TEXT]``
"""

import argparse
import logging
import sys
from collections.abc import Sequence

from collectives.logs import configure_logging

from .rewrite import DIED, complete_run

__all__ = ["main"]

logger = logging.getLogger("wagma.results")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m wagma.results", description="Run files.")
    commands = parser.add_subparsers(dest="command", required=True)
    complete = commands.add_parser(
        "complete",
        help="close the run file of a job that ended without closing it",
        description="After a job ended without closing its run file (the launcher killed every rank: "
        "a rank died without MPI fault tolerance), write the rows of every rank's log beside it "
        "(NAME.partial.rows/) into NAME.partial.h5, with its summary, and mark it with --status "
        "where it still says 'running' (a file a rank closed keeps its status). The logs stay "
        "(a resumed run goes on from them); running it again changes nothing. Run it only once "
        "the job has ended.",
    )
    complete.add_argument("path", metavar="PATH", help="the run file: NAME.h5 or NAME.partial.h5")
    complete.add_argument("--status", default=DIED, help="the status of a file nobody closed (default %(default)r)")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        written = complete_run(args.path, args.status)
    except OSError as error:  # no file, or one that cannot be read and has no logs
        logger.error("%s", error)
        return 1
    logger.info("completed %s", written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
