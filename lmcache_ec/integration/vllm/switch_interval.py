"""The interpreter's switch interval in a process that loads encoder outputs.

Between steps vLLM's processes wait on each other in Python: a worker spins
on its input queue, and the engine core on the workers' answers, for a second
after the last message (``shm_broadcast``'s ``SpinCondition``), holding the
GIL but for a ``sched_yield`` now and then. A thread of ours that wakes up
then — the stage channel's and the staging reader's in a worker, the remote
lookup's in the scheduler, after every socket or file read — gets the GIL
back only once the spinning thread is made to switch: up to the switch
interval (Python's default, 5 ms), each time. A staging takes several such
turns: measured on a real ``vllm serve``, a Redis hit's order -> read took
4.4 ms (lone) and 14 ms (concurrent) where the read takes 0.3 ms, and a
remote lookup on a busy engine outlived its 50 ms bound, so the image was
encoded. ``lower`` sets 0.5 ms (only ever lowering it) and ``restore``
gives the old value back; the spinning thread loses nothing it needs, since
it only waits.
"""

from __future__ import annotations

import sys

LOADING_SWITCH_INTERVAL_S = 0.0005


class SwitchInterval:
    """Lowers the interpreter's switch interval for as long as it is held."""

    def __init__(self) -> None:
        self._previous: float | None = None

    def lower(self, seconds: float = LOADING_SWITCH_INTERVAL_S) -> None:
        if self._previous is None and sys.getswitchinterval() > seconds:
            self._previous = sys.getswitchinterval()
            sys.setswitchinterval(seconds)

    def restore(self) -> None:
        if self._previous is not None:
            sys.setswitchinterval(self._previous)
            self._previous = None


__all__ = ["LOADING_SWITCH_INTERVAL_S", "SwitchInterval"]
