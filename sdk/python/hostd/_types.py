"""Data shapes of the hostd HTTP API (docs/api.md), as the SDK hands them to callers. What the
server describes (sandboxes, snapshots, templates, file entries) stays a dict with the API's
field names, typed as a TypedDict generated from docs/openapi.json (hostd/_wire_gen.py), so that
docs/api.md, both SDKs and ``sbx ... --json`` show the same names; what the SDK makes itself
(events, results, displays) is a dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, TypedDict, Union

from . import _wire_gen as _wire

#: The kinds of exec events: output lines, rich outputs (with ``display=True``), a notebook
#: cell's count, value and exception (with ``notebook=True``), the exit code.
EventType = Literal["stdout", "stderr", "display", "execution_count", "result", "error", "exit"]

#: A MIME bundle as in Jupyter's display protocol: ``image/png`` and ``image/jpeg`` are base64,
#: ``text/*`` and ``image/svg+xml`` strings, ``application/json`` any JSON value.
MimeBundle = Dict[str, Any]


@dataclass(frozen=True)
class ExecEvent:
    """One event of an exec stream.

    ``type`` ``"stdout"`` or ``"stderr"``: ``data`` is one line, without its newline (in a
    notebook cell ``partial`` says it does not end its line); ``"display"`` and ``"result"``:
    ``data`` is a MIME bundle; ``"execution_count"``: ``data`` is the notebook cell's count;
    ``"error"``: ``data`` is a CellError; ``"exit"``: ``data`` is the exit code. ``seq`` counts
    from 0 within one exec; ``ts`` is host wall-clock milliseconds. ``error`` is set only on
    hostd's in-stream failure report, which the SDK raises as ExecutorError instead.
    """

    type: EventType
    data: Union[str, int, MimeBundle, "CellError"]
    seq: int
    ts: int
    error: Optional[str] = None
    partial: bool = False


@dataclass(frozen=True)
class CellError:
    """A notebook cell's uncaught exception: its class name (``NameError``), its message, and
    its traceback as Python prints it."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class Display:
    """A rich output made convenient: the common MIME types as fields (``png`` and ``jpeg``
    decoded to bytes), and the whole bundle in ``data`` for the others."""

    #: The raw MIME bundle, as hostd sent it.
    data: MimeBundle
    #: ``text/plain``: every display has one.
    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    latex: Optional[str] = None
    #: ``image/svg+xml``.
    svg: Optional[str] = None
    png: Optional[bytes] = None
    jpeg: Optional[bytes] = None
    #: ``application/json``.
    json: Any = None
    #: Notebook cells: a DataFrame's columns, ``{column: [value, ...]}``.
    dataframe: Optional[Dict[str, List[Any]]] = None
    #: Notebook cells: what a matplotlib figure plots (docs/api.md, Notebook mode).
    chart: Optional[Dict[str, Any]] = None


@dataclass(frozen=True)
class RunResult:
    """What ``Sandbox.run`` returns: every line of each stream followed by a newline, and the
    rich outputs in order (empty unless the run asked for ``display=True``)."""

    stdout: str
    stderr: str
    exit_code: int
    displays: List[Display] = field(default_factory=list)
    #: Notebook cells: the value of the last expression (None when it had none).
    result: Optional[Display] = None
    #: Notebook cells: the uncaught exception, if there was one.
    error: Optional[CellError] = None
    #: Notebook cells: the cell's execution count in its context.
    execution_count: Optional[int] = None


# The payloads the server describes: the generated TypedDicts (docs/openapi.json's
# components.schemas, by ``npm run gen:sdk-types``) under the SDK's names and docstrings. Each
# subclass adds no field of its own (test/unit/wire-drift.test.ts checks it), so it has
# exactly the generated keys.


class ContextInfo(_wire.Context):
    """A REPL context (docs/api.md, Contexts): ``id`` (``default`` for the REPL's own
    namespace), its working directory, and the notebook cells it has run."""


class NetworkInfo(_wire.SandboxInfoNetwork):
    """A sandbox's egress rules and traffic counts."""


class MergeInfo(_wire.SandboxInfoMergedFromItem):
    """One merge into a sandbox: the winner's id (gone since) and when (ISO 8601)."""


class SandboxInfo(_wire.SandboxInfo):
    """A sandbox as ``GET /v1/sandboxes/{id}`` describes it. ``state``: ``ready`` (running),
    ``paused`` (on disk, resumed by its next use) or ``failed`` (see ``error``).
    ``memory_mib``: host memory that is the sandbox's own (None while paused or failed);
    ``merged_from``: the sandboxes merged into it, oldest first; ``metadata``: the labels given
    at create; ``timeout`` and ``on_timeout``: its lifetime in seconds of running time and what
    happens when it is up; ``expires_at``: when a running sandbox's lifetime ends;
    ``paused_by``: why a paused sandbox is paused. The keys after ``queued`` are not required,
    as an older hostd may not send them."""


class EntryInfo(_wire.FileEntry):
    """A file, directory or link inside a sandbox. ``mode`` is the permission bits as a number
    (``420`` is ``0o644``); a symlink also has ``target`` (None when the guest could not read
    the link)."""


class WriteInfo(_wire.FileWritten):
    """What ``files.write`` wrote."""


class TransferInfo(TypedDict):
    """What ``files.upload_dir`` and ``files.download_dir`` moved: the destination directory,
    regular files and their bytes. Written here, not generated: ``download_dir`` makes it, and
    ``files`` is required, which the generated FileWritten (where it is not) cannot say before
    Python 3.11's ``Required``; wire-drift.test.ts checks it has FileWritten's keys."""

    path: str
    files: int
    size: int


class SnapshotInfo(_wire.Snapshot):
    """A snapshot as hostd describes it; ``sandboxes`` counts those still using its files,
    ``name`` is the name it was given, or None."""


class TemplateInfo(_wire.Template):
    """A template as hostd describes it. ``state`` ``building``: creates raise
    TemplateUnavailableError; ``failed``: TemplateFailedError (``error`` says why).
    ``image_key`` and ``built_at`` are None while it builds or after a failed build."""
