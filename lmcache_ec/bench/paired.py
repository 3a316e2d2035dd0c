"""Paired ratios with a confidence interval, and a verdict only when it is clear.

``bench serve`` sends each request to every subject back to back (the same
image, the same machine state), so the two TTFTs of a pair share the noise
of that moment. The ratio of two subjects is estimated on those pairs, on
the log scale: ``d_i = ln(a_i / b_i)``; the ratio is ``exp(mean d)`` (the
geometric mean of the pair ratios) and its interval ``exp(mean d ± t ·
sd(d) / sqrt(n))`` with Student's t at ``n - 1`` degrees of freedom. A
verdict is given only when the whole interval lies on one side of the
target; an interval that contains it is ``INCONCLUSIVE``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95


class Verdict(enum.Enum):
    PASS = "pass"  # the interval lies at or below the target
    FAIL = "fail"  # the interval lies above the target
    INCONCLUSIVE = "inconclusive"  # the interval contains the target


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # geometric mean of a_i / b_i
    low: float
    high: float
    n: int  # pairs
    confidence: float = CONFIDENCE


def ratio_interval(
    subject: Sequence[float], reference: Sequence[float], confidence: float = CONFIDENCE
) -> RatioInterval | None:
    """The ratio ``subject / reference`` over paired samples, with its interval.

    None with fewer than 2 pairs, or a sample that is not a positive number.
    """
    if len(subject) != len(reference):
        raise ValueError(f"{len(subject)} samples paired with {len(reference)}")
    if len(subject) < 2 or any(not (v > 0) for v in (*subject, *reference)):
        return None
    logs = [math.log(a / b) for a, b in zip(subject, reference, strict=True)]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in logs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return RatioInterval(
        math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, confidence
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


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: the x with P(T <= x) = ``p`` at ``df`` degrees of freedom."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2
    for _ in range(100):  # bisection to double precision
        middle = (low + high) / 2
        if _t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _t_cdf(x: float, df: int) -> float:
    """P(T <= x) for x >= 0: 1 - I_{df/(df+x^2)}(df/2, 1/2) / 2."""
    return 1 - 0.5 * _incomplete_beta(df / (df + x * x), df / 2, 0.5)


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):  # converges faster on the other side
        return 1 - _incomplete_beta(1 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return front * result / a


__all__ = ["CONFIDENCE", "RatioInterval", "Verdict", "ratio_interval", "t_quantile", "verdict"]
