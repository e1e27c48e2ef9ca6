"""One options object per training algorithm: each option's name, default, documentation and check."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any, Literal, get_args

from .base import Options, Wording, option, options_of
from .checks import boolean, int_at_least, number_in, one_of, positive_number

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11's

__all__ = [
    "ADPSGDOptions",
    "ALGORITHM_NAMES",
    "AlgorithmName",
    "AllreduceSGDOptions",
    "Auto",
    "COMPRESSIONS",
    "Compression",
    "DPSGDOptions",
    "DiLoCoOptions",
    "EAGER_LIMITER",
    "EagerSGDOptions",
    "EnsembleSyncOptions",
    "HierarchicalSGDOptions",
    "LATE",
    "Late",
    "LocalSGDOptions",
    "OPTIONS",
    "QUORUMS",
    "Quorum",
    "SGPOptions",
    "SYNCS",
    "StreamingDiLoCoOptions",
    "Sync",
    "WagmaOptions",
    "auto_group_size",
    "has_outer_optimizer",
    "parse_levels",
]

#: The values of the ``sync`` option, how the global synchronizations
#: reduce: ``"allreduce"`` (the tuned allreduce) or ``"stragglar"``
#: (StragglAR with the rank predicted to arrive last as its straggler,
#: :mod:`collectives.stragglar.training_sync`; the allreduce while no rank is predicted).
Sync = Literal["allreduce", "stragglar"]
#: The values of :data:`Sync`, in its order.
SYNCS: tuple[Sync, ...] = get_args(Sync)

#: The values of the ``compression`` option, what an average puts on the
#: wire: ``"none"`` (float32), ``"bf16"``, ``"fp16"``, or ``"int8"`` (a scale
#: per 256 values, with error feedback); the sums stay float32
#: (:mod:`collectives.compression`, whose values these are, spelled here too:
#: the options import no MPI).
Compression = Literal["none", "bf16", "fp16", "int8"]
#: The values of :data:`Compression`, in its order.
COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)

#: The values of eager-SGD's ``quorum`` option, which partial collective starts a version.
Quorum = Literal["solo", "majority", "half"]
#: The values of :data:`Quorum`, in its order.
QUORUMS: tuple[Quorum, ...] = get_args(Quorum)

#: The values of eager-SGD's ``late`` option, what becomes of a gradient its
#: version began without.  The values of :data:`collectives.wait_avoiding.collective.LATE`,
#: spelled here too: the options import no MPI.
Late = Literal["drop", "newest", "accumulate"]
#: The values of :data:`Late`, in its order.
LATE: tuple[Late, ...] = get_args(Late)

#: The value of an option whose value :meth:`~wagma.options.base.Options.resolve`
#: makes concrete for the rank count.
Auto = Literal["auto"]


def _metavar(choices: tuple[str, ...]) -> str:
    return "{" + ",".join(choices) + "}"


def auto_group_size(ranks: int) -> int:
    """WAGMA-SGD's group size S = sqrt(P) (section 5.2), rounded up to the
    groups :class:`~collectives.wait_avoiding.groups.ButterflyGrouping` makes:
    n = 2**floor(floor(log2 P) / 2) groups (the largest power of two <= sqrt(P),
    so that they average at least sqrt(P) ranks) and S = P // n.

    For P a power of two, S = 2**ceil(log2(P) / 2): sqrt(P) as a power of two,
    rounded up for odd log2 P (P = 8 -> 4, P = 32 -> 8): the paper's
    ablations lose accuracy with smaller groups (S = 4 at P = 64) and only
    throughput with larger ones.  For any other P as many groups as on the
    power of two below P, each as large as P allows: P = 6 -> 3 (two
    groups of 3), P = 7 -> 3 (groups of 3 and 4), P = 12 -> 6, P = 24 -> 6
    (four groups of 6).  Every rank's update then reaches every other within
    2 steps (1 for P < 4), as with sqrt(P) on powers of two.
    """
    return ranks // (1 << ((ranks.bit_length() - 1) // 2)) if ranks > 1 else 1


def _sqrt_power_of_two(ranks: int) -> int:
    """sqrt(P) rounded up to a power of two (hierarchical SGD's "auto")."""
    return 1 << math.ceil(math.log2(ranks) / 2) if ranks > 1 else 1


def _sync() -> Any:
    return option(
        "allreduce",
        check=one_of(*SYNCS),
        metavar=_metavar(SYNCS),
        help="how the global averages (Allreduce-SGD's of the gradients, local SGD's and WAGMA-SGD's "
        "every tau steps of the models) reduce: 'allreduce' (the tuned allreduce) or 'stragglar' "
        "(StragglAR with the rank predicted to arrive last as its straggler; the same average up "
        "to the order of the float additions, whoever arrives last).",
    )


def _compression() -> Any:
    return option(
        "none",
        check=one_of(*COMPRESSIONS),
        metavar=_metavar(COMPRESSIONS),
        help="what the averages put on the wire: 'none' (float32), 'bf16', 'fp16', or 'int8' (a scale per "
        "256 values, with error feedback); each contribution is encoded once and the sums stay float32 "
        "(collectives.compression; float32 parameters).",
    )


def _reallocate() -> Any:
    return option(
        False,
        check=boolean,
        help="after each global average, Lemma 1's shares of the global batch for the next period "
        "from the ranks' measured speeds (wagma.reallocation).",
    )


def _outer_lr(default: float, off: str) -> Any:
    return option(
        default,
        check=positive_number,
        parse=float,
        help=f"the outer optimizer's learning rate on the averaged pseudo-gradient (DiLoCo: 0.7){off}.",
    )


def _outer_momentum(default: float) -> Any:
    return option(
        default,
        check=number_in(0, 1, high_included=False),
        parse=float,
        help="the outer optimizer's momentum, in [0, 1) (DiLoCo: 0.9).",
    )


def _outer_nesterov() -> Any:
    return option(True, check=boolean, help="Nesterov's momentum for the outer optimizer (DiLoCo's), else heavy ball.")


#: What the outer options of local SGD and WAGMA-SGD say of their defaults.
_OUTER_OFF = "; 1 with outer_momentum 0 (the default) is the plain average, no outer optimizer"


def has_outer_optimizer(options: "Options") -> bool:
    """Whether local SGD's or WAGMA-SGD's options ask for an outer step on
    the global average (``outer_lr`` other than 1 or ``outer_momentum`` other than 0)."""
    return getattr(options, "outer_lr", 1.0) != 1.0 or getattr(options, "outer_momentum", 0.0) != 0.0


@options_of("allreduce_sgd")
class AllreduceSGDOptions(Options):
    """Allreduce-SGD's options (DDP's bucketed gradient averaging)."""

    bucket_cap_mb: float = option(
        25.0, check=positive_number, parse=float, help="bucket size in MB (10**6 bytes), DDP's default 25."
    )
    sync: Sync = _sync()
    compression: Compression = _compression()


@options_of("local_sgd")
class LocalSGDOptions(Options):
    """Local SGD's options."""

    period: int = option(
        1,
        check=int_at_least(1),
        parse=int,
        help="tau: steps between model averages; 1 is synchronous model averaging (the WAGMA "
        "paper's baseline, section 5.1), 10 its ablation 1.",
    )
    reallocate: bool = _reallocate()
    sync: Sync = _sync()
    outer_lr: float = _outer_lr(1.0, _OUTER_OFF)
    outer_momentum: float = _outer_momentum(0.0)
    outer_nesterov: bool = _outer_nesterov()
    compression: Compression = _compression()


def _group_size(value: object, name: str, ranks: int, say: Wording) -> str | None:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ranks:
        return f"{name} must be an int from 1 to {say.ranks(ranks)}, or 'auto', got {value!r}"
    return None


def _int_or_auto(text: str) -> int | Auto:
    if text == "auto":
        return "auto"
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an int or 'auto', got {text!r}")
    return int(text)


@options_of("wagma")
class WagmaOptions(Options):
    """WAGMA-SGD's options (Algorithm 2's S, tau, alpha and beta)."""

    group_size: int | Auto = option(
        "auto",
        check=_group_size,
        parse=_int_or_auto,
        metavar="S",
        help="S, the butterfly group size: an int from 1 to P (groups of S ranks for P and S powers of "
        "two, else of S to 2S), or 'auto' = sqrt(P) rounded up (section 5.2): P // n with n the largest "
        "power of two <= sqrt(P), a power of two where P is one (4 at P = 8, 3 at P = 6).",
    )
    tau: int = option(
        10, check=int_at_least(1), parse=int, help="the global averaging period (Algorithm 2, line 8; the paper: 10)."
    )
    wait_avoiding: bool = option(
        True, check=boolean, help="alpha: the wait-avoiding group allreduce between global averages."
    )
    group_averaging: bool = option(
        False,
        check=boolean,
        help="beta: a blocking group allreduce between global averages (D-PSGD/SGP-like; needs wait_avoiding off).",
    )
    fixed_groups: bool = option(
        False,
        check=boolean,
        help="average in iteration 0's groups at every step, not Algorithm 1's dynamic "
        "butterfly groups (the paper's ablation 2, section 5.2).",
    )
    reallocate: bool = _reallocate()
    sync: Sync = _sync()
    outer_lr: float = _outer_lr(1.0, _OUTER_OFF)
    outer_momentum: float = _outer_momentum(0.0)
    outer_nesterov: bool = _outer_nesterov()
    compression: Compression = _compression()

    def _relations(self, ranks: int, say: Wording) -> str | None:
        if self.wait_avoiding and self.group_averaging:
            return (
                f"{say('wait_avoiding')} and {say('group_averaging')} cannot both be on (Algorithm 2's "
                f"alpha and beta): turn {say('wait_avoiding')} off for the blocking group averaging"
            )
        if self.fixed_groups and not (self.wait_avoiding or self.group_averaging):
            return (
                f"{say('fixed_groups')} needs {say('wait_avoiding')} or {say('group_averaging')}: with "
                f"both off no groups average"
            )
        return None

    def resolve(self, ranks: int) -> "Self":
        if self.group_size != "auto":
            return self
        return type(self)(**{**self.as_dict(), "group_size": auto_group_size(ranks)})

    def fit(self, ranks: int) -> "tuple[Self, list[str]]":
        if isinstance(self.group_size, int) and self.group_size > ranks:
            return (
                type(self)(**{**self.as_dict(), "group_size": ranks}),
                [f"group_size {self.group_size} is more than {ranks} ranks: {ranks}"],
            )
        return self, []


@options_of("diloco")
class DiLoCoOptions(Options):
    """DiLoCo's options (Douillard et al., 2023: H and the outer optimizer)."""

    period: int = option(
        500, check=int_at_least(1), parse=int, help="H: inner steps between outer steps (DiLoCo: 500)."
    )
    outer_lr: float = _outer_lr(0.7, "")
    outer_momentum: float = _outer_momentum(0.9)
    outer_nesterov: bool = _outer_nesterov()
    sync: Sync = _sync()
    compression: Compression = _compression()


@options_of("streaming_diloco")
class StreamingDiLoCoOptions(Options):
    """Streaming DiLoCo's options (Douillard et al., 2025: H, the fragments, tau, alpha, the outer optimizer)."""

    period: int = option(
        100,
        check=int_at_least(1),
        parse=int,
        help="H: inner steps between two outer steps of one fragment (Streaming DiLoCo: 100).",
    )
    fragments: int = option(
        2,
        check=int_at_least(1),
        parse=int,
        help="M: the fragments, each a stride of the model's layers, synchronized on schedules "
        "staggered by H / M steps (at most the model's layers).",
    )
    overlap_steps: int = option(
        1,
        check=int_at_least(0),
        parse=int,
        help="tau: inner steps a fragment's exchange overlaps before its outer step is applied, "
        "0 to H - 1 (0: no overlap; Streaming DiLoCo: 1 to 5).",
    )
    mixing: float = option(
        0.5,
        check=number_in(0, 1, high_included=True),
        parse=float,
        help="alpha: an overlapped fragment becomes alpha * local + (1 - alpha) * global "
        "(Streaming DiLoCo: 0.5; 0 drops the tau steps' local progress, torchft's default).",
    )
    outer_lr: float = _outer_lr(0.7, "")
    outer_momentum: float = _outer_momentum(0.9)
    outer_nesterov: bool = _outer_nesterov()
    compression: Compression = _compression()

    def _relations(self, ranks: int, say: Wording) -> str | None:
        if self.overlap_steps >= self.period:
            return (
                f"{say('overlap_steps')} must be below {say('period')} ({self.period}), got {self.overlap_steps}: "
                f"a fragment's exchange must be applied before its next one begins"
            )
        if self.fragments > self.period:
            return (
                f"{say('fragments')} must be at most {say('period')} ({self.period}), got {self.fragments}: "
                f"each fragment needs its own step of the period to begin its exchange"
            )
        return None


@options_of("dpsgd")
class DPSGDOptions(Options):
    """D-PSGD's options."""

    compression: Compression = _compression()


@options_of("adpsgd")
class ADPSGDOptions(Options):
    """AD-PSGD's options."""

    compression: Compression = _compression()


def _most_peers(ranks: int) -> int:
    # The paper's 1 or 2 on any P (on 2 ranks both pushes go to the one
    # other rank), and up to the ceil(log2 P) distinct offsets 2**k of the graph.
    return max(2, (ranks - 1).bit_length())


def _peers(value: object, name: str, ranks: int, say: Wording) -> str | None:
    most = _most_peers(ranks)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        return f"{name} must be an int from 1 to max(2, ceil(log2 P)) = {most} on {say.ranks(ranks)}, got {value!r}"
    return None


@options_of("sgp")
class SGPOptions(Options):
    """SGP's options."""

    peers: int = option(
        1,
        check=_peers,
        parse=int,
        help="out-peers per step on the exponential graph, 1 to max(2, ceil(log2 P)) (the paper: 1 or 2).",
    )
    compression: Compression = _compression()

    def fit(self, ranks: int) -> "tuple[Self, list[str]]":
        most = _most_peers(ranks)
        if isinstance(self.peers, int) and self.peers > most:
            return (
                type(self)(**{**self.as_dict(), "peers": most}),
                [f"peers {self.peers} is more than max(2, ceil(log2 P)) = {most} on {ranks} ranks: {most}"],
            )
        return self, []


def _limiter(value: object, name: str, ranks: int, say: Wording) -> str | None:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{name} must be an int >= 0 (0: none) or 'auto', got {value!r}"
    return None


#: The limiter of ``limiter="auto"``, the reference's for solo (``LIMITER``
#: 32 in its training scripts), none for the majority, whose reference
#: leaves it commented out (``ffrand_allreduce.c``).
EAGER_LIMITER: dict[Quorum, int] = {"solo": 32, "majority": 0, "half": 0}


@options_of("eager_sgd")
class EagerSGDOptions(Options):
    """Eager-SGD's options (the partial collective, the late gradient's fate, the limiter)."""

    quorum: Quorum = option(
        "majority",
        check=one_of(*QUORUMS),
        metavar=_metavar(QUORUMS),
        help="which partial collective starts a version: 'solo' (the first rank to arrive), "
        "'majority' (one rank drawn per version, the same on every rank, as the authors' "
        "code does) or 'half' (once ceil(P/2) ranks have arrived).",
    )
    late: Late = option(
        "drop",
        check=one_of(*LATE),
        metavar=_metavar(LATE),
        help="what becomes of a gradient its version began without: 'drop' (the authors' code), "
        "'newest' (the next version takes the rank's newest gradient) or 'accumulate' (the "
        "next version takes the sum of every gradient not yet applied).",
    )
    limiter: int | Auto = option(
        "auto",
        check=_limiter,
        parse=_int_or_auto,
        metavar="N",
        help="after N partial versions one that waits for every rank; 0: none; 'auto': "
        "32 for solo, 0 otherwise (the authors' code).",
    )
    activator_seed: int = option(
        0,
        check=int_at_least(0),
        parse=int,
        help="the seed of the majority's activator sequence (the same on every rank).",
    )
    compression: Compression = _compression()

    def resolve(self, ranks: int) -> "Self":
        if self.limiter != "auto":
            return self
        return type(self)(**{**self.as_dict(), "limiter": EAGER_LIMITER[self.quorum]})


def parse_levels(text: str) -> dict[int, int | Literal["P"]]:
    """``"2:4,10:P"`` -> ``{2: 4, 10: "P"}``: period -> group size (P: all ranks)."""
    levels: dict[int, int | Literal["P"]] = {}
    for item in text.split(","):
        period, sep, size = (s.strip() for s in item.partition(":"))
        if not sep or not period.isdigit() or not (size.isdigit() or size == "P"):
            raise argparse.ArgumentTypeError(
                f"expected PERIOD:SIZE[,PERIOD:SIZE...] with SIZE an integer or P, got {text!r}"
            )
        levels[int(period)] = "P" if size == "P" else int(size)
    return levels


def _levels(value: object, name: str, ranks: int, say: Wording) -> str | None:
    if value == "auto":
        return None
    if not isinstance(value, dict) or not value:
        return f"{name} must be 'auto' or a non-empty dict {{period: group size}}, got {value!r}"
    periods = list(value)
    sizes = [ranks if s == "P" else s for s in value.values()]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in periods + sizes):
        return f"{name} must map ints >= 1 to ints >= 1 or 'P', got {value!r}"
    if periods != sorted(set(periods)):
        return f"{name}'s periods must be increasing, got {periods}"
    if sizes[-1] != ranks:
        return f"the last group size in {name} must be all {say.ranks(ranks)} ('P'), got {sizes[-1]}"
    if any(ranks % s for s in sizes):
        return f"every group size in {name} must divide {say.ranks(ranks)}, got {sizes}"
    return None


@options_of("hierarchical_sgd")
class HierarchicalSGDOptions(Options):
    """Hierarchical SGD's options (the names of PyTorch's ``HierarchicalModelAverager``)."""

    period_group_size_dict: dict[int, int | Literal["P"]] | Auto = option(
        "auto",
        check=_levels,
        parse=parse_levels,
        metavar="PERIOD:SIZE,...",
        help="{period: group size}, periods increasing, the last size all ranks ('P'): groups of consecutive "
        "ranks average every period steps, only the largest firing period; 'auto' = {2: sqrt(P), 10: P} "
        "(sqrt(P) rounded up to a power of two, or the largest divisor of P below that).",
    )
    warmup_steps: int = option(
        0, check=int_at_least(0), parse=int, help="steps of gradient averaging before the local steps begin."
    )
    compression: Compression = _compression()

    def resolve(self, ranks: int) -> "Self":
        levels = self.period_group_size_dict
        if levels == "auto":
            # sqrt(P) as a power of two, or the largest divisor of P below it.
            levels = {2: _largest_divisor(ranks, _sqrt_power_of_two(ranks)), 10: "P"}
        levels = {period: ranks if size == "P" else size for period, size in levels.items()}
        return type(self)(**{**self.as_dict(), "period_group_size_dict": levels})

    def fit(self, ranks: int) -> "tuple[Self, list[str]]":
        levels = self.period_group_size_dict
        if not isinstance(levels, dict) or not levels:
            return self, []
        last = list(levels)[-1]
        fitted: dict[int, int | Literal["P"]] = {}
        for period, size in levels.items():
            if period == last or size == "P":
                fitted[period] = "P"  # all ranks, as many as there are
            elif isinstance(size, int) and ranks % size:
                fitted[period] = _largest_divisor(ranks, size)
            else:
                fitted[period] = size
        changed = {p: s for p, s in fitted.items() if s != levels[p] and not (s == "P" and levels[p] == ranks)}
        if not changed:
            return self, []
        notes = [
            f"period_group_size_dict's last group size {levels[p]} (period {p}) becomes all {ranks} ranks ('P')"
            if p == last
            else f"period_group_size_dict's group size {levels[p]} (period {p}) does not divide {ranks} ranks: {s}"
            for p, s in changed.items()
        ]
        return type(self)(**{**self.as_dict(), "period_group_size_dict": fitted}), notes


def _largest_divisor(ranks: int, most: int) -> int:
    """The largest divisor of ``ranks`` that is at most ``most``."""
    return max(d for d in range(1, min(most, ranks) + 1) if ranks % d == 0)


@options_of("ensemble_sync")
class EnsembleSyncOptions(Options):
    """EnsembleSync's options."""

    period: int = option(10, check=int_at_least(1), parse=int, help="T, local steps between synchronizations.")
    timeout_s: float = option(
        30.0,
        check=positive_number,
        parse=float,
        help="seconds a synchronization waits for late ranks after the first one reports (the paper: 30).",
    )
    reallocate: bool = _reallocate()
    compression: Compression = _compression()


#: The algorithms' names, as ``create`` and ``--algo`` take them (the keys of :data:`OPTIONS`).
AlgorithmName = Literal[
    "adpsgd",
    "allreduce_sgd",
    "diloco",
    "dpsgd",
    "eager_sgd",
    "ensemble_sync",
    "hierarchical_sgd",
    "local_sgd",
    "sgp",
    "streaming_diloco",
    "wagma",
]
#: The values of :data:`AlgorithmName`, in its order.
ALGORITHM_NAMES: tuple[AlgorithmName, ...] = get_args(AlgorithmName)

#: The options object of each algorithm, by the name ``create`` and ``--algo`` take.
OPTIONS: dict[str, type[Options]] = {
    cls.algorithm: cls
    for cls in (
        ADPSGDOptions,
        AllreduceSGDOptions,
        DiLoCoOptions,
        DPSGDOptions,
        EagerSGDOptions,
        EnsembleSyncOptions,
        HierarchicalSGDOptions,
        LocalSGDOptions,
        SGPOptions,
        StreamingDiLoCoOptions,
        WagmaOptions,
    )
}
