"""``python -m collectives.bench NAME [options]``: run one benchmark."""

import sys

from . import allreduce, stragglar, wagma

BENCHMARKS = {"allreduce": allreduce.main, "stragglar": stragglar.main, "wagma": wagma.main}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHMARKS:
        sys.exit(f"usage: python -m collectives.bench {{{','.join(BENCHMARKS)}}} "
                 f"[options]; got {argv[:1] or 'nothing'}")
    BENCHMARKS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
