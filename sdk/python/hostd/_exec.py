"""Turns the lines of an exec response into events: parsed, put in ``seq`` order, checked for
the in-stream failure report. Any way the stream can go wrong after its 200 (a broken
connection, a malformed line, no ``exit`` event, an ``exit`` with ``error``) becomes an
ExecutorException."""

from __future__ import annotations

import json
from typing import Dict, Iterable, Iterator, Optional, Tuple

from ._errors import ExecutorException
from ._types import ExecEvent


def parse_event(line: str) -> Tuple[int, Optional[ExecEvent]]:
    """``(seq, event)``; event is None for a type this SDK does not know (a newer server):
    it keeps its place in the order and is skipped."""
    try:
        value = json.loads(line)
    except ValueError:
        raise ExecutorException("hostd sent an exec line that is not JSON: %s" % line[:200]) from None
    seq = value.get("seq") if isinstance(value, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ExecutorException("hostd sent a malformed exec event: %s" % line[:200])
    kind, data = value.get("type"), value.get("data")
    if kind in ("stdout", "stderr") and isinstance(data, str):
        return seq, ExecEvent(kind, data, seq, int(value.get("ts", 0)))
    if kind == "exit" and isinstance(data, int) and not isinstance(data, bool):
        error = value.get("error")
        return seq, ExecEvent(kind, data, seq, int(value.get("ts", 0)), None if error is None else str(error))
    if kind in ("stdout", "stderr", "exit"):
        raise ExecutorException("hostd sent a malformed exec event: %s" % line[:200])
    return seq, None


def in_seq_order(items: Iterable[Tuple[int, Optional[ExecEvent]]]) -> Iterator[ExecEvent]:
    """Events in ``seq`` order from 0, holding back any that arrive early; what is still held
    when the stream ends (a gap that never filled) is released in ``seq`` order."""
    early: Dict[int, Optional[ExecEvent]] = {}
    expected = 0
    for seq, event in items:
        if seq < expected or seq in early:
            continue  # a duplicate
        early[seq] = event
        while expected in early:
            ready = early.pop(expected)
            expected += 1
            if ready is not None:
                yield ready
    for seq in sorted(early):
        ready = early[seq]
        if ready is not None:
            yield ready


def exec_events(lines: Iterable[str]) -> Iterator[ExecEvent]:
    """The events of one exec, in order, ending after the ``exit`` event."""
    source = iter(lines)
    try:
        for event in in_seq_order(parse_event(line) for line in source):
            if event.type != "exit":
                yield event
                continue
            if event.error is not None:
                raise ExecutorException(event.error or "the exec failed in the sandbox", event=event)
            yield event
            return
        raise ExecutorException("the exec stream ended without an exit event")
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
