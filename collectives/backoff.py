"""Polling back-off for progress threads that must not burn a core."""

import threading
import time

__all__ = ["Backoff"]


class Backoff:
    """Sleep between polls: ``first`` seconds, doubling up to ``cap``.

    ``reset()`` after a poll that made progress; ``wait(event)`` or
    ``sleep()`` otherwise.
    Sleeping on an :class:`threading.Event` lets another thread cut the sleep
    short by setting it (the main thread does so when it hands work over).

    Args:
        first: the first sleep, 0.1 ms by default.
        cap: the longest sleep, 4 ms by default; it bounds the latency with
            which an idle thread notices a message.
    """

    def __init__(self, first: float = 1e-4, cap: float = 4e-3) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"Backoff needs 0 < first <= cap, got first={first}, cap={cap}")
        self.first, self.cap = first, cap
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    def wait(self, event: threading.Event) -> None:
        """Sleep for the current delay (or until ``event`` is set), then double it."""
        event.wait(self.delay)
        self.delay = min(2 * self.delay, self.cap)

    def sleep(self) -> None:
        """Sleep for the current delay, then double it."""
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, self.cap)
