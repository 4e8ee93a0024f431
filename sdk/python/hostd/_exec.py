"""Turns the lines of an exec response into events: parsed, put in ``seq`` order, checked for
the in-stream failure report. Any way the stream can go wrong after its 200 (a broken
connection, a malformed line, no ``exit`` event, an ``exit`` with ``error``) becomes an
ExecutorError; silence past the stream's timeout is RequestTimeoutError. The blocking and the
asyncio flavours share everything but the loop."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, AsyncIterator, Dict, Iterable, Iterator, List, Optional, Tuple

from ._errors import ConnectionException, ExecutorError, RequestTimeoutError
from ._types import CellError, ExecEvent

if TYPE_CHECKING:
    from ._ahttp import AsyncResponse
    from ._http import Response


def parse_event(line: str) -> Tuple[int, Optional[ExecEvent]]:
    """``(seq, event)``; event is None for a type this SDK does not know (a newer server): it
    keeps its place in the order and is skipped."""
    try:
        value = json.loads(line)
    except ValueError:
        raise ExecutorError("hostd sent an exec line that is not JSON: %s" % line[:200]) from None
    seq = value.get("seq") if isinstance(value, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ExecutorError("hostd sent a malformed exec event: %s" % line[:200])
    kind, data = value.get("type"), value.get("data")
    ts = int(value.get("ts", 0))
    if kind in ("stdout", "stderr") and isinstance(data, str):
        return seq, ExecEvent(kind, data, seq, ts, partial=value.get("partial") is True)
    if kind in ("display", "result") and isinstance(data, dict):
        return seq, ExecEvent(kind, data, seq, ts)
    if kind in ("exit", "execution_count") and isinstance(data, int) and not isinstance(data, bool):
        error = value.get("error") if kind == "exit" else None
        return seq, ExecEvent(kind, data, seq, ts, None if error is None else str(error))
    if kind == "error" and isinstance(data, dict) and all(
        isinstance(data.get(k), str) for k in ("name", "value", "traceback")
    ):
        return seq, ExecEvent(kind, CellError(data["name"], data["value"], data["traceback"]), seq, ts)
    if kind in ("stdout", "stderr", "display", "result", "execution_count", "error", "exit"):
        raise ExecutorError("hostd sent a malformed exec event: %s" % line[:200])
    return seq, None


class _Order:
    """Puts events back in ``seq`` order from 0, holding back any that arrive early; what is
    still held when the stream ends (a gap that never filled) is released in ``seq`` order."""

    def __init__(self) -> None:
        self._early: Dict[int, Optional[ExecEvent]] = {}
        self._expected = 0

    def push(self, seq: int, event: Optional[ExecEvent]) -> List[ExecEvent]:
        if seq < self._expected or seq in self._early:
            return []  # a duplicate
        self._early[seq] = event
        ready = []
        while self._expected in self._early:
            held = self._early.pop(self._expected)
            self._expected += 1
            if held is not None:
                ready.append(held)
        return ready

    def rest(self) -> List[ExecEvent]:
        return [e for _, e in sorted(self._early.items()) if e is not None]


def _checked(event: ExecEvent) -> ExecEvent:
    if event.type == "exit" and event.error is not None:
        raise ExecutorError(event.error or "the exec failed in the sandbox", event=event)
    return event


def _no_exit() -> ExecutorError:
    return ExecutorError("the exec stream ended without an exit event")


def _broke(e: ConnectionException) -> ExecutorError:
    return ExecutorError("the exec stream broke: %s" % e.message)


def in_seq_order(items: Iterable[Tuple[int, Optional[ExecEvent]]]) -> Iterator[ExecEvent]:
    order = _Order()
    for seq, event in items:
        yield from order.push(seq, event)
    yield from order.rest()


def exec_events(response: "Response") -> Iterator[ExecEvent]:
    """The events of one exec, in order, ending after the ``exit`` event. Closing the generator
    early closes the connection, which tells hostd to interrupt the code."""
    try:
        for event in in_seq_order(parse_event(line) for line in _lines(response)):
            yield _checked(event)
            if event.type == "exit":
                return
        raise _no_exit()
    finally:
        response.close()


def _lines(response: "Response") -> Iterator[str]:
    while True:
        try:
            raw = response.readline()
        except RequestTimeoutError:
            raise
        except ConnectionException as e:
            raise _broke(e) from e
        if not raw:
            return
        line = raw.decode("utf-8", errors="replace").strip()
        if line:
            yield line


async def aexec_events(response: "AsyncResponse") -> AsyncIterator[ExecEvent]:
    """The asyncio twin of exec_events."""
    order = _Order()
    try:
        while True:
            try:
                raw = await response.readline()
            except RequestTimeoutError:
                raise
            except ConnectionException as e:
                raise _broke(e) from e
            if not raw:
                break
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            for event in order.push(*parse_event(line)):
                yield _checked(event)
                if event.type == "exit":
                    return
        for event in order.rest():
            yield _checked(event)
            if event.type == "exit":
                return
        raise _no_exit()
    finally:
        await response.aclose()
