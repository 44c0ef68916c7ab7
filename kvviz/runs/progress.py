"""A run's progress in forward passes, for a bar with the time left (the app) or a log line."""

from __future__ import annotations

from collections.abc import Callable


class Progress:
    """Counts a run's forward passes for ``report(done, total)``; ``total`` is an upper bound that tightens as the run
    learns how long its replies are (an exception ``report`` raises abandons the run)."""

    def __init__(self, report: Callable[[int, int], None] | None, total: int):
        self.report, self.done, self.total = report, 0, total

    def tick(self) -> None:
        self.done += 1
        if self.report is not None:
            self.report(self.done, max(self.total, self.done))
