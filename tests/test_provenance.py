"""What a results file records about the MPI library: strings HDF5 can store, from either library."""

import pytest

from collectives.mpi_library import clean_library_string, mpi_library

# What the two wheels return, verbatim (Open MPI 5.0.11's ends in its C NUL;
# MPICH 5.0.2's is a dozen lines).
OPEN_MPI = (
    "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, "
    "repo rev: v5.0.11rc1, Sep 16, 2026\x00"
)
MPICH = "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\nMPICH ABI:    18:2:6\n"


@pytest.mark.parametrize(
    "raw, clean",
    [
        (OPEN_MPI, OPEN_MPI[:-1]),
        (MPICH, "MPICH Version:      5.0.2"),
        ("lib\x00garbage after the terminator", "lib"),
        ("tab\tand\x07bell\n2nd line", "tab and bell"),
        ("", ""),
        ("\x00", ""),
    ],
)
def test_library_strings_are_cut_at_nul_and_first_line(raw, clean):
    assert clean_library_string(raw) == clean


def test_the_loaded_library_is_named_and_clean():
    name, version, description = mpi_library()
    assert name in description and version.split(".")[0] in description
    for text in (name, version, description):
        assert text and text.isprintable() and "\x00" not in text
