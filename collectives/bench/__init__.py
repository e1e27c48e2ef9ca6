"""Benchmarks of the collectives, side by side with the MPI library's own."""
