"""Start MPI jobs with whichever library is installed: MPICH's hydra or Open MPI's PRRTE.

The two ``mpiexec`` programs take different flags for the same job on a
workstation: PRRTE refuses to place more ranks than cores without
``--oversubscribe`` and to run as root without ``--allow-run-as-root``; hydra
needs neither. Under Slurm, ``srun`` needs the process-management interface
the library speaks: PMI-2 for MPICH (``--mpi=pmi2``), PMIx for Open MPI
(``--mpi=pmix``). This module is the one place that knows it; the campaign,
the tests, ``scripts/mpi-pytest`` and ``slurm/launch.sh`` all go through it::

    .venv/bin/python -m experiments.mpirun -n 8 -- .venv/bin/python -m experiments.train --algo wagma
    .venv/bin/python -m experiments.mpirun --print -n 8      # the launcher's words, for a script
    .venv/bin/python -m experiments.mpirun --srun-mpi        # pmi2 or pmix
    .venv/bin/python -m experiments.mpirun --library         # which MPI mpi4py loads
    .venv-openmpi/bin/python -m experiments.mpirun --fault-tolerant -n 4 -- ...   # ranks may die

Fault tolerance (``--fault-tolerant``): a job whose survivors must go on when
a rank is killed needs ULFM, which of the two wheels only Open MPI has
(``ompi_info``: ``FT MPI support: yes``): PRRTE's ``--with-ft ulfm`` turns it
on, and the communicators the survivors use must return errors
(``MPI.ERRORS_RETURN``) instead of aborting; then a collective a dead rank
was in fails with ``MPI.ERR_PROC_FAILED`` (or ``ERR_REVOKED`` on the ranks
another survivor revoked), and ``Revoke`` + ``Shrink`` give the survivors a
communicator without it, while ``mpiexec`` leaves them running and exits 0.
MPICH 5.0.2's wheel aborts in ``MPI_Init`` with ``MPIR_CVAR_ENABLE_FT=1``, so
``--fault-tolerant`` with MPICH is refused.  A fault-tolerant job is also
given a secret (``$WAGMA_JOB_SECRET``, 256 random bits, unless one is set
already), which replacements that join it must prove
(:mod:`collectives.admission`); PRRTE forwards it to every rank and to the
processes the ranks spawn.

Which ``mpiexec``: ``$MPIEXEC``, else the one next to this Python (the MPI
wheel's), else the one on PATH. Which library: what ``mpiexec --version``
says (``HYDRA`` or ``Open MPI``); a launcher it cannot tell gets no extra
flags. ``$MPIEXEC_FLAGS`` (split like a shell would) is added after ours.

Stale sessions: Open MPI's launcher keeps its session in ``$TMPDIR/ompi.<its
pid>`` and removes it when it exits; one killed by a signal (a deadline, a
hung test, the OOM killer) leaves it behind, and a later launcher that the
kernel gives the same pid refuses to start, because its PMIx rendezvous file
exists already ("The PMIx server's listener thread failed to start", exit
status 213; later PMIx releases reclaim such files, the 5.0.11 wheel's does
not).  With pids up to 32768 and thousands of processes an hour, a test
suite or a campaign meets this now and then, so :func:`mpiexec_command`
removes the sessions of launchers that are no longer running
(:func:`remove_stale_sessions`) before it hands out an Open MPI command line.
"""

import argparse
import functools
import os
import secrets
import shlex
import shutil
import stat
import subprocess
import sys

__all__ = [
    "LAUNCHERS",
    "find_mpiexec",
    "launcher_flags",
    "launcher_library",
    "loaded_library",
    "mpiexec_command",
    "main",
    "remove_stale_sessions",
    "srun_mpi_plugin",
]

#: The environment variable that holds a fault-tolerant job's secret (:data:`collectives.admission.SECRET_VARIABLE`,
#: named here too so that starting a job does not import MPI).
SECRET_VARIABLE = "WAGMA_JOB_SECRET"
#: ``mpiexec --version`` marker -> the library's short name.
LAUNCHERS = {"HYDRA": "mpich", "Open MPI": "openmpi"}
#: mpi4py's vendor name -> the short name.
_VENDORS = {"MPICH": "mpich", "Open MPI": "openmpi"}
#: The ``srun --mpi`` plugin of each library.
_SRUN_PLUGINS = {"mpich": "pmi2", "openmpi": "pmix"}


def find_mpiexec():
    """``$MPIEXEC``, else the ``mpiexec`` next to this interpreter (the MPI
    wheel's), else the one on PATH, else None.  A path (``MPIEXEC=.venv/bin/mpiexec``,
    as make passes it) is made absolute, so it still works from another directory."""
    given = os.environ.get("MPIEXEC")
    if given:
        return os.path.abspath(given) if os.sep in given else given
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")


@functools.lru_cache(maxsize=None)
def launcher_library(mpiexec: str) -> str:
    """``"mpich"``, ``"openmpi"`` or ``"unknown"``: whose ``mpiexec`` this is,
    from its ``--version`` text."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = out.stdout + out.stderr
    return next((lib for marker, lib in LAUNCHERS.items() if marker in text), "unknown")


def launcher_flags(library: str, euid: int = None, fault_tolerant: bool = False) -> list:
    """The flags a workstation job needs from this library's ``mpiexec``:
    Open MPI's ``--oversubscribe`` (8 ranks on 2 cores is how this framework
    is tested) and, for root (containers, CI), ``--allow-run-as-root``; with
    ``fault_tolerant``, ULFM (``--with-ft ulfm``) and no barrier at the start
    of ``MPI_Finalize`` (``--mca async_mpi_finalize 1``).

    Why no barrier: ``MPI_Finalize`` begins with a PMIx fence over every
    process of the job, and after a rank was killed that fence sometimes
    waits for the dead rank for ever (the survivors spin in
    ``ompi_mpi_finalize``; 1 run in 4 of tests/test_slurm.py's killed-rank job
    with the Open MPI 5.0.11 wheel; open-mpi/ompi#11404).  The fence only
    makes sure no message is left in flight at exit; every exchange here
    completes its sends before the ranks finalize (the run file's collector,
    the coordinator, the algorithms' ``close``), so nothing depends on it.

    Raises:
        ValueError: ``fault_tolerant`` with a library that has no fault
            tolerance here (MPICH's wheel, an unrecognised launcher).
    """
    if fault_tolerant and library != "openmpi":
        raise ValueError(
            f"--fault-tolerant needs Open MPI's ULFM (make venv MPI=openmpi, .venv-openmpi); "
            f"this launcher is {library}'s, and MPICH 5.0.2's wheel aborts in MPI_Init "
            f"with MPIR_CVAR_ENABLE_FT=1"
        )
    if library != "openmpi":
        return []
    euid = os.geteuid() if euid is None else euid
    return (
        ["--oversubscribe"]
        + (["--allow-run-as-root"] if euid == 0 else [])
        + (["--with-ft", "ulfm", "--mca", "async_mpi_finalize", "1"] if fault_tolerant else [])
        + (["-x", SECRET_VARIABLE] if fault_tolerant and SECRET_VARIABLE in os.environ else [])
    )


def _session_base() -> str:
    """The folder Open MPI's launcher keeps its sessions in: the first of
    ``$TMPDIR``, ``$TEMP`` and ``$TMP`` that is set, else ``/tmp`` (PRRTE's
    own order, not :func:`tempfile.gettempdir`'s, which checks the folders)."""
    return next((os.environ[name] for name in ("TMPDIR", "TEMP", "TMP") if os.environ.get(name)), "/tmp")


def _running(pid: int) -> bool:
    """Whether a process with this pid exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_sessions(base: str = None) -> list:
    """Remove the session folders (``ompi.<pid>`` in ``base``, by default the
    launcher's temporary folder) that Open MPI launchers killed by a signal
    left behind, and return their paths.

    Only this user's folders whose launcher is no longer running go: a pid
    that is running may be a launcher at work, or another process that was
    given the pid since, and its folder stays until that process is gone.
    The pid of the process calling is not a launcher's: ``main`` becomes
    the launcher, with its pid, when it execs ``mpiexec``.  A launcher that
    starts with a removed folder's pid starts as on a clean machine; one
    that met the folder would have refused to start."""
    base = base or _session_base()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    removed = []
    for entry in entries:
        prefix, _, pid = entry.name.partition(".")
        if prefix != "ompi" or not pid.isdigit():
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        if int(pid) != os.getpid() and _running(int(pid)):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def mpiexec_command(ranks: int, mpiexec: str = None, fault_tolerant: bool = False) -> list:
    """``[mpiexec, flags..., $MPIEXEC_FLAGS..., "-n", ranks]``: the start of a
    command line that runs ``ranks`` processes with the library at hand
    (``fault_tolerant``: see :func:`launcher_flags`).  With Open MPI's
    launcher it first removes the sessions killed launchers left behind
    (:func:`remove_stale_sessions`), so that the job it starts cannot meet one."""
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ValueError(f"ranks must be a positive integer, got {ranks!r}")
    mpiexec = mpiexec or find_mpiexec()
    if not mpiexec:
        raise FileNotFoundError("no mpiexec next to this Python or on PATH; set MPIEXEC")
    library = launcher_library(mpiexec)
    if library == "openmpi":
        remove_stale_sessions()
    return [
        mpiexec,
        *launcher_flags(library, fault_tolerant=fault_tolerant),
        *shlex.split(os.environ.get("MPIEXEC_FLAGS", "")),
        "-n",
        str(ranks),
    ]


def loaded_library() -> tuple:
    """``(short name, description)`` of the MPI library mpi4py loads, read
    without initializing MPI (safe in a batch script outside any launcher)."""
    if "mpi4py.MPI" not in sys.modules:  # else MPI is loaded already, as its importer chose
        import mpi4py

        mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from collectives.mpi_library import mpi_library

    name, version, description = mpi_library()
    return _VENDORS.get(name, "unknown"), f"{name} {version}: {description}"


def srun_mpi_plugin() -> str:
    """``pmi2`` or ``pmix``: the ``srun --mpi`` value for the library mpi4py loads."""
    library, description = loaded_library()
    if library not in _SRUN_PLUGINS:
        raise RuntimeError(f"no srun --mpi plugin known for {description}; set SRUN_MPI")
    return _SRUN_PLUGINS[library]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.mpirun",
        description="Run a command on N MPI ranks with the mpiexec at hand and the flags its "
        "library needs (or print them).",
        epilog="examples:\n"
        "  .venv/bin/python -m experiments.mpirun -n 2 -- .venv/bin/python -m mpi4py -c "
        "'from mpi4py import MPI; print(MPI.COMM_WORLD.rank)'\n"
        "  .venv/bin/python -m experiments.mpirun --print -n 8\n"
        "  .venv/bin/python -m experiments.mpirun --library",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", type=int, metavar="RANKS", help="number of ranks")
    parser.add_argument(
        "--fault-tolerant",
        action="store_true",
        help="survivors go on when a rank dies (Open MPI's ULFM: --with-ft ulfm)",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--print", action="store_true", help="print the launcher's words (shell-quoted) instead of running"
    )
    what.add_argument("--srun-mpi", action="store_true", help="print srun's --mpi plugin for the loaded library")
    what.add_argument(
        "--library", action="store_true", help="print the MPI library mpi4py loads and the mpiexec that would start it"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the program and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.srun_mpi:
        print(srun_mpi_plugin())
        return 0
    if args.library:
        mpiexec = find_mpiexec()
        print(f"mpi4py loads: {loaded_library()[1]}")
        print(f"mpiexec: {mpiexec} ({launcher_library(mpiexec) if mpiexec else 'none found'})")
        return 0
    if args.n is None or args.n < 1:
        parser.error(f"-n must be a positive number of ranks, got {args.n}")
    if not args.print and not command:
        parser.error("give the command to run after --, or --print")
    if args.fault_tolerant and not args.print:
        os.environ.setdefault(SECRET_VARIABLE, secrets.token_hex(32))  # never printed: it stays in the environment
    try:
        words = mpiexec_command(args.n, fault_tolerant=args.fault_tolerant) + command
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    if args.print:
        print(shlex.join(words))
        return 0
    os.execvp(words[0], words)


if __name__ == "__main__":
    sys.exit(main())
