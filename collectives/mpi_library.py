"""Which MPI library mpi4py loaded: its name, version and description, as strings a results file can store."""

from mpi4py import MPI

__all__ = ["clean_library_string", "mpi_library"]


def clean_library_string(text: str) -> str:
    """``text`` as a results file can store it: cut at the first NUL, every
    other control character a space, the first line only, stripped.

    The MPI libraries hand back C buffers: Open MPI 5's
    ``MPI_Get_library_version`` ends in the NUL that terminates it (HDF5
    rejects a variable-length string with an embedded NUL), MPICH's runs over
    a dozen lines.
    """
    text = text.split("\0", 1)[0].strip()
    first = text.splitlines()[0] if text else ""
    return "".join(c if c.isprintable() else " " for c in first).strip()


def mpi_library() -> tuple[str, str, str]:
    """``(name, version, description)`` of the MPI library mpi4py loaded, all
    cleaned: e.g. ``("Open MPI", "5.0.11", "Open MPI v5.0.11, package: ...")``
    or ``("MPICH", "5.0.2", "MPICH Version: 5.0.2")``. The name and version
    come from :func:`mpi4py.MPI.get_vendor`, the description from
    ``MPI_Get_library_version``."""
    name, version = MPI.get_vendor()
    return (clean_library_string(name), ".".join(map(str, version)), clean_library_string(MPI.Get_library_version()))
