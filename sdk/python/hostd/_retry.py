"""When to send a request again. Only ``429`` (a cap: sandboxes alive, requests queued) and
``503`` (short of memory or disk, a template still building, shutting down) can succeed later
without the caller changing anything, so only those are retried: after the server's
``Retry-After``, else after an exponential backoff. Every other error is the caller's to see.
Shared by the blocking and the asyncio clients."""

from __future__ import annotations

import random as _random
import time
from email.utils import parsedate_to_datetime
from typing import Callable, Optional

#: A ``Retry-After`` longer than this (milliseconds) is not waited for: the error goes to the caller.
MAX_RETRY_AFTER_MS = 30_000
#: The first backoff (milliseconds) when the server gave no ``Retry-After``; it doubles each retry.
FIRST_BACKOFF_MS = 500
_MAX_BACKOFF_MS = 8_000


def retry_delay_ms(
    status: int,
    retry_after_ms: Optional[int],
    attempt: int,
    max_retries: int,
    random: Callable[[], float] = _random.random,
) -> Optional[int]:
    """Milliseconds to wait before retry number ``attempt + 1``, or None to give up. The jitter
    (up to a quarter of the backoff) keeps clients that failed together from retrying together."""
    if status not in (429, 503) or attempt >= max_retries:
        return None
    if retry_after_ms is not None:
        return retry_after_ms if retry_after_ms <= MAX_RETRY_AFTER_MS else None
    backoff = min(FIRST_BACKOFF_MS * 2**attempt, _MAX_BACKOFF_MS)
    return int(round(backoff * (1 + random() / 4)))


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[int]:
    """``Retry-After`` in milliseconds: delay-seconds or an HTTP date; None when absent or bad."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return int(text) * 1000
    try:
        when = parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0, int(round((when - (time.time() if now is None else now)) * 1000)))
