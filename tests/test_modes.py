"""Each registry keyed by a fixed set of names has exactly the names of its Literal type (no MPI job)."""

from typing import get_args

import pytest

from collectives.schedules import blocking
from collectives.wait_avoiding import LATE, collective
from collectives.wait_avoiding.group_allreduce import (
    GROUP_ALLREDUCE_ALGORITHMS,
    GROUP_ALLREDUCE_CHOICES,
    GroupAllreduceAlgorithm,
    GroupAllreduceChoice,
    GroupAllreduceSchedule,
)
from wagma.algorithms import ALGORITHMS
from wagma.emulate import EMULATED
from wagma.models import MODELS, ModelName
from wagma.options import ALGORITHM_NAMES, OPTIONS, algorithms
from wagma.sim import kernels


@pytest.mark.parametrize(
    "registry, names",
    [
        (blocking.ALLREDUCE_ALGORITHMS, blocking.AllreduceSchedule),
        (blocking.ALLREDUCE_CHOICES, blocking.AllreduceChoice),
        (blocking.REDUCE_SCATTER_ALGORITHMS, blocking.ReduceScatterAlgorithm),
        (blocking.ALLGATHER_ALGORITHMS, blocking.AllgatherAlgorithm),
        (GROUP_ALLREDUCE_ALGORITHMS, GroupAllreduceSchedule),
        (OPTIONS, algorithms.AlgorithmName),
        (algorithms.EAGER_LIMITER, algorithms.Quorum),
        (MODELS, ModelName),
        (kernels.LATE_CODES, algorithms.Late),
    ],
)
def test_a_registry_has_the_names_of_its_literal(registry, names):
    assert tuple(registry) == get_args(names)


def test_the_choices_extend_the_schedules():
    assert get_args(blocking.AllreduceChoice) == (*blocking.ALLREDUCE_ALGORITHMS, "mpi")
    assert get_args(blocking.AllreduceAlgorithm) == (*blocking.ALLREDUCE_CHOICES, "auto")
    assert get_args(GroupAllreduceChoice) == GROUP_ALLREDUCE_CHOICES == (*GROUP_ALLREDUCE_ALGORITHMS, "mpi")
    assert get_args(GroupAllreduceAlgorithm) == (*GROUP_ALLREDUCE_CHOICES, "auto")


def test_the_options_spell_the_collectives_values():
    # wagma.options imports no MPI, so it spells eager-SGD's late readings itself.
    assert algorithms.LATE == LATE == collective.LATE
    assert set(EMULATED) <= set(ALGORITHM_NAMES) == set(ALGORITHMS)
