"""The ``traceparent`` header (W3C Trace Context) sent with every request: the current
OpenTelemetry span when ``opentelemetry`` is importable and a span is active, so hostd's work
nests under the caller's trace; otherwise fresh random ids for each request."""

from __future__ import annotations

import importlib
import os
from typing import Any, Optional

_UNSET = object()
_otel_trace: Any = _UNSET


def _load_otel() -> Any:
    """``opentelemetry.trace``, or None when it is not installed; looked up once."""
    global _otel_trace
    if _otel_trace is _UNSET:
        try:
            _otel_trace = importlib.import_module("opentelemetry.trace")
        except Exception:  # not installed, or broken: random ids it is
            _otel_trace = None
    return _otel_trace


def reset_for_tests() -> None:
    """Forget the cached import, so that a test can install or remove a fake module."""
    global _otel_trace
    _otel_trace = _UNSET


def _span_traceparent() -> Optional[str]:
    trace = _load_otel()
    if trace is None:
        return None
    try:
        ctx = trace.get_current_span().get_span_context()
        if not ctx or not ctx.is_valid:
            return None
        trace_id, span_id, flags = int(ctx.trace_id), int(ctx.span_id), int(ctx.trace_flags)
    except Exception:
        return None
    if not (0 < trace_id < 1 << 128 and 0 < span_id < 1 << 64):
        return None
    return "00-%032x-%016x-%02x" % (trace_id, span_id, flags & 0xFF)


def _random_hex(n_bytes: int) -> str:
    while True:
        value = os.urandom(n_bytes).hex()
        if value.strip("0"):  # all zeros is an invalid id in Trace Context
            return value


def traceparent() -> str:
    """A traceparent for the next request."""
    return _span_traceparent() or "00-%s-%s-01" % (_random_hex(16), _random_hex(8))
