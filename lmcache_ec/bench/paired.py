"""Paired ratios with a confidence interval, and a verdict only when it is clear.

``bench serve`` sends each request to every subject back to back (the same
image, the same machine state), so the two TTFTs of a pair share the noise
of that moment. The ratio of two subjects is estimated on those pairs: the
median of the pair ratios ``a_i / b_i``, and its distribution-free interval,
the order statistics ``r_(k)`` and ``r_(n+1-k)`` of the sorted pair ratios,
``k`` the largest with ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``
(the sign test's interval: it covers the true median with at least
``confidence`` whatever the noise's shape). A pair that lands on a stall of
the machine moves one order statistic, not the interval, where a mean and a
standard deviation would let one outlier swing both. A verdict is given only
when the whole interval lies on one side of the target; an interval that
contains it is ``INCONCLUSIVE``.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95


class Verdict(enum.Enum):
    PASS = "pass"  # the interval lies at or below the target
    FAIL = "fail"  # the interval lies above the target
    INCONCLUSIVE = "inconclusive"  # the interval contains the target


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # median of a_i / b_i
    low: float
    high: float
    n: int  # pairs
    confidence: float = CONFIDENCE  # the interval's exact coverage is at least this


def order_statistic_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """The ``k`` of the median's interval ``[r_(k), r_(n+1-k)]`` over ``n`` pairs, or 0
    when ``n`` pairs are too few for ``confidence`` (at 95 %: fewer than 6)."""
    tail = (1 - confidence) / 2
    below, k = 0.0, 0  # below: P(Binomial(n, 1/2) < k + 1)
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    return k


def min_pairs(confidence: float = CONFIDENCE) -> int:
    """The fewest pairs that give an interval at ``confidence`` (6 at 95 %)."""
    n = 1
    while order_statistic_rank(n, confidence) == 0:
        n += 1
    return n


def ratio_interval(
    subject: Sequence[float], reference: Sequence[float], confidence: float = CONFIDENCE
) -> RatioInterval | None:
    """The ratio ``subject / reference`` over paired samples, with its interval.

    None with too few pairs for ``confidence``, or a sample that is not a positive number.
    """
    if len(subject) != len(reference):
        raise ValueError(f"{len(subject)} samples paired with {len(reference)}")
    if any(not (v > 0) for v in (*subject, *reference)):
        return None
    k = order_statistic_rank(len(subject), confidence)
    if k == 0:
        return None
    logs = sorted(math.log(a / b) for a, b in zip(subject, reference, strict=True))
    return RatioInterval(
        math.exp(statistics.median(logs)),
        math.exp(logs[k - 1]),
        math.exp(logs[len(logs) - k]),
        len(logs),
        confidence,
    )


def verdict(interval: RatioInterval | None, target: float) -> Verdict:
    """PASS when the ratio is at most ``target`` with the interval's confidence,
    FAIL when it is above it, INCONCLUSIVE when the interval contains it (or
    there is no interval)."""
    if interval is None:
        return Verdict.INCONCLUSIVE
    if interval.high <= target:
        return Verdict.PASS
    if interval.low > target:
        return Verdict.FAIL
    return Verdict.INCONCLUSIVE


__all__ = [
    "CONFIDENCE",
    "RatioInterval",
    "Verdict",
    "min_pairs",
    "order_statistic_rank",
    "ratio_interval",
    "verdict",
]
