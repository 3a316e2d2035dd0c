"""How long one engine step may still wait on the tiers.

The scheduler waits within a step for answers that are a round trip away (a
remote lookup, a claim, a staging on the stage channel) rather than deferring
the request to a later step. The budget is long when nothing runs
(``idle_stage_wait_s``: a lone request loads in the step it arrives) and
short while requests run, or once the step has let one through
(``busy_stage_wait_s``: the cost of a read inside the step, which the
batch pays).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class StepWait:
    def __init__(self, idle_s: float, busy_s: float, busy: Callable[[], bool]) -> None:
        self.idle_s = idle_s
        self.busy_s = busy_s
        self.busy = busy
        self.waited = 0.0  # seconds this step has waited so far

    def budget(self) -> float:
        """Seconds this step may wait in all."""
        return self.busy_s if self.busy() else self.idle_s

    def left(self) -> float:
        return self.budget() - self.waited

    def wait(self, waiter: Callable[[float], Any], limit: float) -> bool:
        """Call ``waiter(seconds)`` for what is left of the budget, at most
        ``limit``, and count the time; False if nothing was left."""
        seconds = min(self.left(), limit)
        if seconds <= 0:
            return False
        started = time.monotonic()
        waiter(seconds)
        self.waited += time.monotonic() - started
        return True

    def new_step(self) -> None:
        self.waited = 0.0
