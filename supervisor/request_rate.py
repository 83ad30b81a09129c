"""Requests per minute: how many requests started in the last 60 seconds.

A sliding window of start times rather than a decaying average, so that the figure is
exact and explainable ("12 requests began in the last minute"). Memory is bounded by
the rate itself: times older than the window are dropped on every call. Pure: the caller
passes the clock (monotonic seconds), so tests need no sleeping.
"""

from __future__ import annotations

from collections import deque

WINDOW_SECONDS = 60.0


class RequestRate:
    def __init__(self, window: float = WINDOW_SECONDS) -> None:
        if not window > 0:
            raise ValueError(f"window must be positive, got {window!r}")
        self.window = window
        self._starts: deque[float] = deque()

    def record(self, now: float) -> None:
        """One request started at `now`."""
        self._forget(now)
        self._starts.append(now)

    def count(self, now: float) -> int:
        """Requests started in (now - window, now]."""
        self._forget(now)
        return len(self._starts)

    def _forget(self, now: float) -> None:
        # Times arrive in order (one monotonic clock), so the oldest are at the left.
        cutoff = now - self.window
        while self._starts and self._starts[0] <= cutoff:
            self._starts.popleft()
