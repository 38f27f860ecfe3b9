"""A token bucket with an injected clock. Pure: no sleeping here, the caller sleeps.

``rate`` tokens per second accrue up to ``burst``; :meth:`TokenBucket.take` spends ``n`` tokens
and returns how long to wait before the spend is allowed (0.0 when it is allowed now). Debt is
allowed — the tokens are spent at once and the wait says when the bucket is back at zero — so
a caller that sleeps for the returned time holds exactly ``rate`` per second over any window
longer than ``burst / rate``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    def __init__(self, rate: float, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        """``rate`` > 0 tokens per second; ``burst`` (default: one second's worth, at least 1) is
        the most that may be spent at once after an idle spell. The bucket starts full."""
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"TokenBucket: rate must be a finite number > 0 per second; got {rate!r}")
        burst = max(1.0, rate) if burst is None else burst
        if not (math.isfinite(burst) and burst >= 1):
            raise ValueError(f"TokenBucket: burst must be >= 1; got {burst!r}")
        self.rate, self.burst, self.clock = rate, float(burst), clock
        self._tokens = self.burst
        self._at = clock()

    @property
    def tokens(self) -> float:
        """Tokens available now (negative: in debt)."""
        self._refill()
        return self._tokens

    def take(self, n: float = 1.0) -> float:
        """Spend ``n`` tokens; return the seconds to wait before acting on them."""
        if n < 0:
            raise ValueError(f"TokenBucket.take: n must be >= 0; got {n!r}")
        self._refill()
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def _refill(self) -> None:
        now = self.clock()
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
