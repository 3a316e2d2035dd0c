"""The fault suite's one assertion, and the calls every case makes through it.

Every answer the cache gives under a fault must be either the exact tensor
that was stored (same dtype, same shape, same bytes) or a miss (``None``),
and no call may raise to its caller. ``get_checked``/``put_checked`` make the
call, turn an escaping exception into a test failure that says so, and apply
``exact_or_miss`` to the answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from tests.conftest import bit_equal


def exact_or_miss(answer: Any, expected: torch.Tensor) -> bool:
    """True for a hit that is bit-equal to ``expected``, False for a miss; else fail."""
    if answer is None:
        return False
    assert isinstance(answer, torch.Tensor), f"answer is a {type(answer).__name__}"
    assert answer.dtype == expected.dtype, f"wrong dtype {answer.dtype}, stored {expected.dtype}"
    assert answer.shape == expected.shape, f"wrong shape {tuple(answer.shape)}"
    assert bit_equal(answer, expected), "a hit returned different bytes than were stored"
    return True


def _call(what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # the point of the suite: nothing escapes
        pytest.fail(f"{what} raised to its caller: {exc!r}")


def get_checked(cache: Any, mm_hash: str, expected: torch.Tensor) -> bool:
    """``cache.get`` that must not raise and must answer exact-or-miss; True on a hit."""
    return exact_or_miss(_call(f"get({mm_hash!r:.40})", lambda: cache.get(mm_hash)), expected)


def get_many_checked(
    cache: Any, mm_hashes: Sequence[str], expected: Sequence[torch.Tensor]
) -> list[bool]:
    answers = _call("get_many", lambda: cache.get_many(list(mm_hashes)))
    assert len(answers) == len(expected)
    return [exact_or_miss(a, e) for a, e in zip(answers, expected, strict=True)]


def put_checked(cache: Any, mm_hash: str, tensor: torch.Tensor) -> bool:
    """``cache.put`` of a valid tensor: a bool, never an exception."""
    stored = _call(f"put({mm_hash!r:.40})", lambda: cache.put(mm_hash, tensor))
    assert isinstance(stored, bool)
    return stored


def contains_checked(cache: Any, mm_hash: str) -> str | None:
    return _call(f"contains({mm_hash!r:.40})", lambda: cache.contains(mm_hash))


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02):
    """Seconds until ``predicate()`` is truthy; fails after ``timeout`` ("never recovers").

    ``timeout`` is a generous bound, not a performance target.
    """
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)
    return time.monotonic() - started


def snapshot(cache: Any) -> dict[str, Any]:
    return cache.stats.snapshot()
