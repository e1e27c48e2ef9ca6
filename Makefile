# make venv   create .venv (torch pinned to a CPU build, MPICH wheel, test tools)
# make test   serial tests, then the MPI tests on 2, 4 and 8 ranks
# make bench  allreduce benchmark on 4 ranks
# make main   the main job: 8 ranks train on digits with the WAGMA paper's imbalance,
#             once per algorithm (7 runs, about 8 minutes on 2 cores), then the table
# make clean  remove build files, caches and test logs (distclean: the venv too)
#
# Nothing depends on an activated shell: every command names $(VENV)/bin/...
# On a cluster: make venv EXTRAS=test TORCH_SPEC='torch==2.13.0' with mpi4py
# built against the site MPI, and MPIEXEC=<site launcher>.

VENV ?= .venv
PY := $(VENV)/bin/python
MPIEXEC ?= $(VENV)/bin/mpiexec
# Pinned: a looser spec pulls the multi-GB CUDA wheels.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= test,mpich

MPI_SIZES ?= 2 4 8
# Seconds: one test (pytest-timeout), one whole stage (coreutils timeout).
TEST_TIMEOUT ?= 120
STAGE_TIMEOUT ?= 600
# -x: a rank stops at its first failure, and mpi4py then aborts every rank.
MPI_FAIL_FAST ?= -x
# Extra pytest arguments for every stage, e.g. PYTEST_ARGS='-k butterfly'.
PYTEST_ARGS ?=

STAMP := $(VENV)/.wagma-installed

.PHONY: venv test bench main clean distclean

venv: $(STAMP)

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# Reinstalls only when the package metadata changes (or the venv is new).
$(STAMP): setup.cfg pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install '$(TORCH_SPEC)'
	$(PY) -m pip install -e '.[$(EXTRAS)]'
	touch $@

# One recipe line per MPI stage: make stops at the first stage that fails.
# `-m mpi` selects the MPI tests. (pytest-mpi 0.6's --only-mpi is not used: next
# to --with-mpi, which mpi-pytest always passes, it has no effect and every
# serial test runs on every rank too; on its own it lists each serial test as
# skipped and ignores the mpi_skip/mpi_xfail marks.)
define mpi_stage
	PYTHON=$(PY) MPIEXEC=$(MPIEXEC) MPI_PYTEST_TIMEOUT=$(STAGE_TIMEOUT) \
	scripts/mpi-pytest $(1) -m mpi $(MPI_FAIL_FAST) \
	  --timeout=$(TEST_TIMEOUT) --timeout-method=thread $(PYTEST_ARGS)

endef

test: venv
	PYTHON=$(PY) MPIEXEC=$(MPIEXEC) \
	timeout -k 10 $(STAGE_TIMEOUT) $(PY) -m pytest --timeout=$(TEST_TIMEOUT) $(PYTEST_ARGS)
	$(foreach n,$(MPI_SIZES),$(call mpi_stage,$(n)))

bench: venv
	$(MPIEXEC) -n 4 $(PY) -m mpi4py -m collectives.bench allreduce

main: venv
	MPIEXEC=$(MPIEXEC) $(PY) -m experiments.campaign main

clean:
	rm -rf build dist .eggs *.egg-info test-logs .pytest_cache
	find . -path './$(VENV)' -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
