"""A StragglAR schedule as data: rounds of chunk transfers, with JSON import and export."""

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Schedule", "Transfer"]


@dataclass(frozen=True)
class Transfer:
    """Rank ``src`` sends chunk ``chunk`` to rank ``dst`` in one round.

    With ``reduce`` the receiver adds it to its own copy of the chunk (the
    exchange of round r between rank r and the straggler); without, the
    receiver stores a fully reduced chunk it lacked (a copy).
    """

    src: int
    dst: int
    chunk: int
    reduce: bool


@dataclass(frozen=True)
class Schedule:
    """The rounds that complete an allreduce after StragglAR's ReduceScatter.

    The buffer is cut into n - 1 chunks.  Precondition (while the straggler
    is late): the non-stragglers have run a ReduceScatter among themselves,
    so that the g-th non-straggler in rank order holds chunk g reduced over
    all non-stragglers (with the straggler last, rank g holds chunk g), and
    the straggler holds its own contribution to every chunk.  Then, round by
    round, every transfer of a round reads the state at the start of the
    round.  Built without MPI; :func:`~collectives.stragglar.verify.verify`
    checks it, a runtime only follows it.
    """

    #: The number of ranks.
    n: int
    #: The straggler's rank.
    straggler: int
    #: A tuple per round of :class:`Transfer` (made a tuple of tuples).
    rounds: Sequence[Sequence[Transfer]]

    def __post_init__(self):
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 2:
            raise ValueError(f"n must be an int >= 2, got {self.n!r}")
        if not 0 <= self.straggler < self.n:
            raise ValueError(f"straggler must be a rank in range({self.n}), got {self.straggler!r}")
        object.__setattr__(self, "rounds", tuple(tuple(r) for r in self.rounds))

    @property
    def num_chunks(self) -> int:
        return self.n - 1

    def owner(self, chunk: int) -> int:
        """The non-straggler that holds ``chunk`` after the ReduceScatter."""
        return chunk if chunk < self.straggler else chunk + 1

    def to_json(self) -> str:
        """``{"n", "straggler", "rounds": [[{"src", "dst", "chunk", "reduce"}...]...]}``."""
        return json.dumps(
            {
                "n": self.n,
                "straggler": self.straggler,
                "rounds": [
                    [{"src": t.src, "dst": t.dst, "chunk": t.chunk, "reduce": t.reduce} for t in r] for r in self.rounds
                ],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        """Parse :meth:`to_json`'s format; ``ValueError`` names what is missing."""
        data = json.loads(text)
        try:
            rounds = [
                [Transfer(int(t["src"]), int(t["dst"]), int(t["chunk"]), bool(t["reduce"])) for t in r]
                for r in data["rounds"]
            ]
            return cls(int(data["n"]), int(data["straggler"]), rounds)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a StragglAR schedule: missing or malformed {exc}") from None

    def __repr__(self):
        transfers = sum(len(r) for r in self.rounds)
        return f"Schedule(n={self.n}, straggler={self.straggler}, {len(self.rounds)} rounds, {transfers} transfers)"
