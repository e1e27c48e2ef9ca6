"""Shared pytest configuration for the test suite."""

# tests/harness holds tests that fail on purpose (they check the MPI test
# runner's fail-fast); they run only when named on the command line.
collect_ignore = ["harness"]
