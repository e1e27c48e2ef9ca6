"""Tuning tables (collectives.schedules.tuning): how a measured table decides what allreduce(algorithm="auto") runs."""

import json
import os

import pytest

from collectives.bench.allreduce import calls_per_repetition, parse_sizes
from collectives.schedules.blocking import SMALL_ALLREDUCE_BYTES, choose_allreduce
from collectives.schedules.tuning import DEFAULT_TUNING_DIR, TuningTable, _find, table_name

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KIB, MIB = 1 << 10, 1 << 20
SETTING = dict(library="MPICH", version="5.0.2", ranks=4, nodes=1, ranks_per_node=4)
# Shaped like the 4-rank MPICH measurement: ours win small and large, the library in between.
RECORD = {
    **SETTING,
    "sizes_bytes": [4 * KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB],
    "median_seconds": {
        "mpi": [9e-5, 3e-4, 1.5e-3, 3e-2, 0.5],
        "ring": [4e-4, 6e-4, 2.5e-3, 2e-2, 0.3],
        "rhd": [2e-4, 4e-4, 2.0e-3, 2.5e-2, 0.35],
        "recursive_doubling": [5e-5, 2e-4, 3.0e-3, 6e-2, 0.9],
    },
}


@pytest.mark.parametrize(
    "nbytes, expected",
    [
        (1, "recursive_doubling"),  # below the smallest size: its winner
        (4 * KIB, "recursive_doubling"),
        (60 * KIB, "recursive_doubling"),  # nearest measured size on a log scale: 64 KiB
        (MIB, "mpi"),
        (3 * MIB, "mpi"),  # log2 distance 1.58 to 1 MiB, 2.42 to 16 MiB
        (5 * MIB, "ring"),  # 2.32 to 1 MiB, 1.68 to 16 MiB
        (1 << 40, "ring"),  # above the largest: its winner
    ],
)
def test_auto_takes_the_fastest_at_the_nearest_measured_size(nbytes, expected):
    assert choose_allreduce(nbytes, 4, TuningTable(RECORD), "float32") == expected


@pytest.mark.parametrize("ours_over_library, expected", [(1.05, "mpi"), (1.29, "mpi"), (1.31, "ring"), (2.0, "ring")])
def test_ours_must_beat_the_library_by_the_margin(ours_over_library, expected):
    # Within LIBRARY_MARGIN (1.3) of each other the two are within the noise: ties go to the library.
    record = {**RECORD, "median_seconds": {"mpi": [1e-3] * 5, "ring": [1e-3 / ours_over_library] * 5}}
    assert choose_allreduce(MIB, 4, TuningTable(record), "float32") == expected
    assert choose_allreduce(MIB, 4, TuningTable(record), "float32", library=False) == "ring"


def test_the_library_is_passed_over_for_dtypes_it_cannot_sum():
    table = TuningTable(RECORD)
    assert choose_allreduce(MIB, 4, table, "float32") == "mpi"
    assert choose_allreduce(MIB, 4, table, "bfloat16") == "rhd"  # the fastest of ours at 1 MiB


def test_the_library_is_passed_over_under_fault_tolerance():
    # Where the table's fastest is the library, library=False takes the fastest of ours.
    table = TuningTable(RECORD)
    assert choose_allreduce(MIB, 4, table, "float32", library=False) == "rhd"


@pytest.mark.parametrize("nbytes", [4, 4 * KIB, SMALL_ALLREDUCE_BYTES, 256 * MIB])
@pytest.mark.parametrize("size", [2, 6, 8, 1024])
def test_without_a_table_auto_takes_the_library(nbytes, size):
    # A setting nobody measured: the library's own selection is never behind the library.
    assert choose_allreduce(nbytes, size) == "mpi"


def test_without_a_table_and_without_the_library_auto_keeps_the_thresholds():
    # float16 has no MPI sum; under fault tolerance the library may not run.
    for kwargs in ({"dtype": "float16"}, {"dtype": "bfloat16"}, {"library": False}):
        assert choose_allreduce(SMALL_ALLREDUCE_BYTES - 1, 8, **kwargs) == "recursive_doubling"
        assert choose_allreduce(SMALL_ALLREDUCE_BYTES, 8, **kwargs) == "rhd"
        assert choose_allreduce(SMALL_ALLREDUCE_BYTES, 6, **kwargs) == "ring"


def test_the_default_folder_is_the_repositorys_tables():
    # Where auto looks without $COLLECTIVES_TUNING: the committed tables, found by their names.
    assert os.path.samefile(DEFAULT_TUNING_DIR, os.path.join(REPOSITORY, "results", "tuning"))
    assert _find(DEFAULT_TUNING_DIR, {**SETTING}).setting == SETTING


def test_table_names_key_library_version_ranks_and_node_shape():
    assert table_name(**SETTING) == "mpich-5.0.2-n4-1x4.json"
    assert table_name("Open MPI", "5.0.11", 16, 2, 8) == "openmpi-5.0.11-n16-2x8.json"


def test_a_folder_or_a_file_gives_the_table_round_trip_and_off_disables(tmp_path):
    (tmp_path / table_name(**SETTING)).write_text(json.dumps(RECORD))
    table = _find(str(tmp_path), SETTING)
    assert table.to_record() == RECORD  # round trip
    assert _find(str(tmp_path), {**SETTING, "ranks": 8}) is None  # no table for 8 ranks
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(RECORD))
    assert _find(str(mine), SETTING).source == str(mine)
    assert _find("off", SETTING) is None


@pytest.mark.parametrize(
    "other", [{"ranks": 8}, {"library": "Open MPI"}, {"version": "4.2.0"}, {"nodes": 2, "ranks_per_node": 2}]
)
def test_a_table_for_another_setting_is_ignored_with_a_warning(tmp_path, other):
    # Given as a file, or found in a folder under this setting's name.
    given = tmp_path / "other.json"
    given.write_text(json.dumps({**RECORD, **other}))
    (tmp_path / table_name(**SETTING)).write_text(json.dumps({**RECORD, **other}))
    for location in (given, tmp_path):
        with pytest.warns(RuntimeWarning, match=rf"tuning table {location}.* ignored: measured for"):
            assert _find(str(location), SETTING) is None


@pytest.mark.parametrize(
    "broken, match",
    [
        ({"sizes_bytes": [MIB, KIB]}, "sizes must ascend"),
        ({"median_seconds": {"ring": [1.0]}}, "one time per size"),
    ],
)
def test_a_malformed_table_is_refused(broken, match):
    with pytest.raises(ValueError, match=match):
        TuningTable({**RECORD, **broken})


@pytest.mark.parametrize("text", ["{not json", json.dumps({"library": "MPICH"}), "[]"])
def test_an_unreadable_table_is_an_error_naming_the_file(tmp_path, text):
    path = tmp_path / table_name(**SETTING)
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"cannot read the tuning table {path}: "):
        _find(str(tmp_path), SETTING)


def test_benchmark_sizes_are_powers_of_four_or_a_list():
    assert parse_sizes("4KiB:256MiB") == [4 * KIB * 4**k for k in range(9)]
    assert parse_sizes("4096,1MiB") == [4096, MIB]
    with pytest.raises(ValueError):
        parse_sizes("4kb:1MiB")


def test_a_repetition_times_up_to_16_mib_of_calls_and_at_most_1024():
    assert [calls_per_repetition(n) for n in (4 * KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB)] == [1024, 256, 16, 1, 1]
