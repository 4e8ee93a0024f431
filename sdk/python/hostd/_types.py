"""Data shapes of the hostd HTTP API (docs/api.md), as the SDK hands them to callers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union


@dataclass(frozen=True)
class ExecEvent:
    """One event of an exec stream.

    ``type`` is ``"stdout"`` or ``"stderr"`` (``data``: one line, without its newline) or
    ``"exit"`` (``data``: the exit code). ``seq`` counts from 0 within one exec; ``ts`` is host
    wall-clock milliseconds. ``error`` is set only on hostd's in-stream failure report, which
    the SDK raises as ExecutorException instead of yielding.
    """

    type: str
    data: Union[str, int]
    seq: int
    ts: int
    error: Optional[str] = None


@dataclass(frozen=True)
class RunResult:
    """What ``Sandbox.run`` returns: every line of each stream followed by a newline."""

    stdout: str
    stderr: str
    exit_code: int
