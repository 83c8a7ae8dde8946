"""The few statistics the benchmarks and the eval report: a median with its spread, and a rate with its 95% interval."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """Repeated timings: their median, the smallest and largest, and how many there were."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        finite = [v for v in values if v is not None and math.isfinite(v)]
        if not finite:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(finite), min(finite), max(finite), len(finite))

    @property
    def relative(self) -> float:
        """(high - low) / median: how far apart the repetitions were."""
        return (self.high - self.low) / self.median if self.median else math.nan

    def as_dict(self) -> dict:
        return {"median": self.median, "low": self.low, "high": self.high, "n": self.n}


@dataclass(frozen=True)
class Rate:
    """k of n, with the Wilson score interval at 95%: honest for small n and for rates near 0 or 1."""

    k: int
    n: int

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        if self.n == 0:
            return (math.nan, math.nan)
        z = 1.959963984540054
        p = self.k / self.n
        denominator = 1 + z * z / self.n
        centre = (p + z * z / (2 * self.n)) / denominator
        half = z * math.sqrt(p * (1 - p) / self.n + z * z / (4 * self.n * self.n)) / denominator
        # exact at the ends, where rounding would put the bound on the wrong side of the rate
        low = 0.0 if self.k == 0 else max(0.0, centre - half)
        high = 1.0 if self.k == self.n else min(1.0, centre + half)
        return (min(low, p), max(high, p))

    def as_dict(self) -> dict:
        low, high = self.interval
        return {"k": self.k, "n": self.n, "rate": self.value, "low": low, "high": high}

    def __str__(self) -> str:
        if self.n == 0:
            return "-"
        return f"{self.value:.0%} ({self.k}/{self.n})"


def rate(flags: Sequence[bool | None]) -> Rate:
    """The share of true among the flags that are known (None: not measured)."""
    known = [f for f in flags if f is not None]
    return Rate(sum(1 for f in known if f), len(known))
