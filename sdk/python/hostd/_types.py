"""Data shapes of the hostd HTTP API (docs/api.md), as the SDK hands them to callers. What the
server describes (sandboxes, snapshots, templates, file entries) stays a dict with the API's
field names, typed as a TypedDict, so that docs/api.md, both SDKs and ``sbx ... --json`` show
the same names; what the SDK makes itself (events, results, displays) is a dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, TypedDict, Union

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


class ContextInfo(TypedDict):
    """A REPL context (docs/api.md, Contexts): ``id`` (``default`` for the REPL's own
    namespace), its working directory, and the notebook cells it has run."""

    id: str
    cwd: str
    execution_count: int


class NetworkInfo(TypedDict):
    """A sandbox's egress rules and traffic counts."""

    allow_out: List[str]
    bytes_out: int
    bytes_in: int


class _SandboxInfoRequired(TypedDict):
    id: str
    state: Literal["ready", "paused", "failed"]
    template: str
    created_at: str
    last_used_at: str
    parent_id: Optional[str]
    busy: bool
    queued: int


class MergeInfo(TypedDict):
    """One merge into a sandbox: the winner's id (gone since) and when (ISO 8601)."""

    id: str
    merged_at: str


class SandboxInfo(_SandboxInfoRequired, total=False):
    """A sandbox as ``GET /v1/sandboxes/{id}`` describes it. ``state``: ``ready`` (running),
    ``paused`` (on disk, resumed by its next use) or ``failed`` (see ``error``).
    ``memory_mib``: host memory that is the sandbox's own (None while paused or failed);
    ``merged_from``: the sandboxes merged into it, oldest first."""

    snapshot_id: Optional[str]
    error: Optional[str]
    network: NetworkInfo
    memory_mib: Optional[float]
    merged_from: List[MergeInfo]
    #: The labels given at create (``{}`` without).
    metadata: Dict[str, str]
    #: Its lifetime in seconds of running time, or None.
    timeout: Optional[float]
    #: ``delete`` or ``pause``: what happens when its lifetime is up; None without one.
    on_timeout: Optional[str]
    #: When a running sandbox's lifetime ends (ISO 8601); None while paused or without one.
    expires_at: Optional[str]
    #: Why a paused sandbox is paused (``request``, ``lifetime``, ``idle``, ``shutdown``); None while it runs.
    paused_by: Optional[str]


class _EntryInfoRequired(TypedDict):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime_ms: int


class EntryInfo(_EntryInfoRequired, total=False):
    """A file, directory or link inside a sandbox. ``mode`` is the permission bits as a number
    (``420`` is ``0o644``); a symlink also has ``target`` (None when the guest could not read
    the link)."""

    target: Optional[str]


class WriteInfo(TypedDict):
    """What ``files.write`` wrote."""

    path: str
    size: int


class TransferInfo(TypedDict):
    """What ``files.upload_dir`` and ``files.download_dir`` moved: the destination directory,
    regular files and their bytes."""

    path: str
    files: int
    size: int


class SnapshotInfo(TypedDict):
    """A snapshot as hostd describes it; ``sandboxes`` counts those still using its files."""

    snapshot_id: str
    source_sandbox_id: str
    template: str
    size_bytes: int
    created_at: str
    sandboxes: int
    #: The name it was given, or None.
    name: Optional[str]


class TemplateInfo(TypedDict):
    """A template as hostd describes it. ``state`` ``building``: creates raise
    TemplateUnavailableError; ``failed``: TemplateFailedError (``error`` says why)."""

    name: str
    default: bool
    state: Literal["building", "ready", "failed"]
    error: Optional[str]
    memory_mib: int
    vcpus: int
    pool_size: int
    disk_mib: int
    description: str
    preload: List[str]
    debian_packages: List[str]
    python_packages: List[str]
    #: The content key of its built image; None while it builds or after a failed build.
    image_key: Optional[str]
    built_at: Optional[str]
