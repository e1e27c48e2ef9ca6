"""Replay a StragglAR schedule on sets of contributions and reject any mistake."""

from .schedule import Schedule

__all__ = ["ScheduleError", "verify"]


class ScheduleError(ValueError):
    """A schedule does not compute a correct allreduce; the message says where."""


def verify(schedule: Schedule) -> Schedule:
    """Check ``schedule`` by replaying it on sets of contributions.

    Each rank's copy of each chunk is the set of ranks whose contributions it
    sums, held as an int's bits (None where the ReduceScatter left no usable
    data).  Rejected: a transfer naming a rank or chunk out of range, a rank
    that sends twice or receives twice in one round, a reduction of sets that
    overlap (double counting) or with no data on either side, a copy of a
    chunk the sender does not hold fully reduced, and a final state in which
    some rank lacks some chunk fully reduced.

    Returns:
        ``schedule``, so that ``verify(generate(n))`` reads naturally.

    Raises:
        ScheduleError: naming the round, the transfer and the rule broken.
    """
    n, s = schedule.n, schedule.straggler
    # A set of ranks is an int's bits (rank i: bit i): union and overlap of
    # 1024 ranks are then one machine-word loop instead of a hash-set walk.
    everyone = (1 << n) - 1
    others = everyone & ~(1 << s)
    state: list[list[int | None]] = [[None] * schedule.num_chunks for _ in range(n)]
    for chunk in range(schedule.num_chunks):
        state[schedule.owner(chunk)][chunk] = others
        state[s][chunk] = 1 << s
    for r, transfers in enumerate(schedule.rounds):
        senders, receivers = set(), set()
        updates = []
        for t in transfers:
            if not (0 <= t.src < n and 0 <= t.dst < n and t.src != t.dst):
                raise _broken(r, t, f"ranks must be two distinct ranks in range({n})")
            if not 0 <= t.chunk < schedule.num_chunks:
                raise _broken(r, t, f"chunk must be in range({schedule.num_chunks})")
            if t.src in senders:
                raise _broken(r, t, f"rank {t.src} sends twice in one round")
            if t.dst in receivers:
                raise _broken(r, t, f"rank {t.dst} receives twice in one round")
            senders.add(t.src)
            receivers.add(t.dst)
            sent, held = state[t.src][t.chunk], state[t.dst][t.chunk]
            if t.reduce:
                if sent is None or held is None:
                    raise _broken(
                        r, t, f"reduces a chunk that rank {t.src if sent is None else t.dst} holds no data of"
                    )
                if sent & held:
                    raise _broken(
                        r, t, f"double counting: contributions of ranks {_ranks(sent & held)} would be added twice"
                    )
                updates.append((t.dst, t.chunk, sent | held))
            else:
                if sent != everyone:
                    raise _broken(r, t, f"copies a chunk rank {t.src} does not hold fully reduced")
                updates.append((t.dst, t.chunk, everyone))
        for rank, chunk, value in updates:
            state[rank][chunk] = value
    for rank in range(n):
        for chunk in range(schedule.num_chunks):
            if state[rank][chunk] != everyone:
                raise ScheduleError(
                    f"after {len(schedule.rounds)} rounds rank {rank} does not hold chunk {chunk} fully reduced"
                )
    return schedule


def _ranks(members: int) -> list[int]:
    """The ranks whose bits are set in ``members``, in increasing order."""
    return [rank for rank in range(members.bit_length()) if members >> rank & 1]


def _broken(r: int, t, rule: str) -> ScheduleError:
    """The error for transfer ``t`` of round ``r`` breaking ``rule`` (described only when raised)."""
    return ScheduleError(f"round {r}, transfer {t}: {rule}")
