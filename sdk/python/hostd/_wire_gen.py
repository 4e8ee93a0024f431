# Generated from docs/openapi.json (components.schemas) by scripts/gen-sdk-types.ts: do not edit.
# Regenerate with `npm run gen:sdk-types`; `npm run gen:sdk-types -- --check` (CI) fails when stale.
# The fields SDK_OPTIONAL (there) names for Python are in the total=False part.
"""The payloads of the hostd HTTP API as docs/openapi.json describes them. Import them from
``hostd`` (hostd/_types.py), which names them as the SDK does."""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict, Union


class Error(TypedDict):
    """The body of every non-2xx response: the contract's ``error`` message plus the stable ``code``
    clients branch on (docs/api.md, Errors). Any route may also answer what Node's HTTP parser
    refuses before a route is chosen: 400 ``invalid_request`` (not HTTP), 408 ``request_timeout``
    (headers too slow), 431 ``headers_too_large`` (request line and headers over 16 KiB)."""

    #: A human-readable message; may change between versions.
    error: str
    #: A stable machine-readable code.
    code: Literal[
        "body_too_large",
        "client_closed_request",
        "cluster_conflict",
        "cluster_unavailable",
        "context_exists",
        "context_is_default",
        "context_not_found",
        "executor_error",
        "file_not_found",
        "file_too_large",
        "hand_over_failed",
        "headers_too_large",
        "insufficient_resources",
        "internal_error",
        "invalid_api_key",
        "invalid_archive",
        "invalid_path",
        "invalid_request",
        "is_a_directory",
        "limit_reached",
        "merge_into_self",
        "missing_api_key",
        "node_draining",
        "node_not_found",
        "node_unavailable",
        "not_a_directory",
        "not_clustered",
        "permission_denied",
        "request_timeout",
        "route_not_found",
        "sandbox_disk_full",
        "sandbox_lost",
        "sandbox_moving",
        "sandbox_not_found",
        "sandboxes_on_different_nodes",
        "shutting_down",
        "snapshot_not_found",
        "storage_limit_reached",
        "template_failed",
        "template_not_found",
        "template_unavailable",
        "unsupported_file",
        "unsupported_media_type",
    ]


class Sandbox(TypedDict):
    """A ready sandbox, as returned by create and in fork children."""

    id: SandboxId
    state: Literal["ready"]


class SandboxInfoNetwork(TypedDict):
    """The sandbox's egress rules and the bytes its connections sent and received (docs/api.md,
    Network)."""

    allow_out: List[str]
    bytes_out: int
    bytes_in: int


class SandboxInfoMergedFromItem(TypedDict):
    id: SandboxId
    merged_at: str


class _SandboxInfoRequired(TypedDict):
    id: SandboxId
    #: ``ready`` runs; ``paused`` is written to disk (resumed by the next operation); ``failed``:
    #: its VM died (``error`` says why).
    state: Literal["ready", "paused", "failed"]
    #: Template the sandbox (or its VM) came from.
    template: str
    created_at: str
    last_used_at: str
    #: The sandbox a fork child came from (it may have been deleted since); null otherwise.
    parent_id: Optional[SandboxId]
    #: True while an exec, fork, merge, snapshot or pause holds the sandbox.
    busy: bool
    #: Requests waiting behind the one holding the sandbox.
    queued: int


class SandboxInfo(_SandboxInfoRequired, total=False):
    """A sandbox as listed and described."""

    #: The snapshot the sandbox was created from, if any.
    snapshot_id: Optional[str]
    #: Why the sandbox failed, when ``state`` is ``failed``.
    error: Optional[str]
    #: The sandbox's egress rules and the bytes its connections sent and received (docs/api.md,
    #: Network).
    network: SandboxInfoNetwork
    #: Host memory (MiB) that is this sandbox's own: its QEMU's anonymous resident memory (pages it
    #: wrote, the TCG translation buffer, QEMU's heap), not the pages it still shares with its
    #: template or fork point. ``null`` while paused or failed.
    memory_mib: Optional[float]
    #: The sandboxes merged into this one (their ids are gone since), oldest first; the 64 most
    #: recent.
    merged_from: List[SandboxInfoMergedFromItem]
    #: The labels given at create (``{}`` without).
    metadata: Dict[str, str]
    #: Its lifetime in seconds of running time; null: none.
    timeout: Optional[float]
    #: What happens when its lifetime is up; null without one.
    on_timeout: Optional[Literal["delete", "pause"]]
    #: When a running sandbox's lifetime ends; null while paused or without one.
    expires_at: Optional[str]
    #: Why a paused sandbox is paused (a pause call, its lifetime, the idle timeout, hostd's
    #: shutdown); null while it runs.
    paused_by: Optional[Literal["request", "lifetime", "idle", "shutdown"]]
    #: Cluster mode only: the node that holds the sandbox (docs/cluster.md). Absent on a single
    #: hostd.
    node: str


class SandboxList(TypedDict):
    sandboxes: List[SandboxInfo]


class CreateRequestNetwork(TypedDict, total=False):
    """Outbound network access; absent means none."""

    #: Egress rules (docs/api.md, Network): ``host``, ``host:port``, ``*.domain``, CIDR, IP, ``*``,
    #: ``host.hostd.internal:PORT``.
    allow_out: List[str]


class CreateRequest(TypedDict, total=False):
    #: Template name; absent or null means the default template (the first of ``GET /v1/templates``:
    #: ``python`` unless ``SERVICE_TEMPLATES`` says otherwise).
    template: Optional[str]
    #: Create the sandbox from this snapshot (``snap_…``) instead of a template; not together with
    #: ``template``.
    snapshot: Optional[str]
    #: The sandbox's default environment: bash's environment and Python's ``os.environ``; fork
    #: children inherit it.
    env: Optional[Dict[str, str]]
    #: Outbound network access; absent means none.
    network: Optional[CreateRequestNetwork]
    #: Labels of yours (at most 64, 16 KiB in all), shown in the sandbox and kept with it; fork
    #: children inherit them.
    metadata: Optional[Dict[str, str]]
    #: A lifetime: seconds of running time, after which the sandbox is deleted (or paused,
    #: ``on_timeout``). Pausing stops the clock; each resume gives the whole lifetime again
    #: (docs/api.md, Metadata and lifetime).
    timeout: Optional[float]
    #: What happens when the lifetime is up (default ``delete``); only with ``timeout``.
    on_timeout: Optional[Literal["delete", "pause"]]


class _ExecRequestRequired(TypedDict):
    #: The code to run; at most the body limit (4 MiB by default).
    code: str


class ExecRequest(_ExecRequestRequired, total=False):
    #: Absent or null means ``python``.
    language: Optional[Literal["python", "bash"]]
    #: Seconds after which the code is interrupted (exit ``124``). Absent or null means no timeout.
    timeout: Optional[float]
    #: Extra environment variables for this exec, over the sandbox's ``env``.
    env: Optional[Dict[str, str]]
    #: Absolute working directory for this exec (default ``/root``); a missing one ends the exec
    #: with exit 1 and a stderr line.
    cwd: Optional[str]
    #: Python: emit rich outputs (figures, tables) as ``display`` events.
    display: Optional[bool]
    #: Python only: the REPL context to run in (see ``Context``); absent or null means the default
    #: context. One the sandbox does not have is ``404 context_not_found``, answered before any
    #: stream.
    context: Optional[str]
    #: Python only: run as a notebook cell (docs/api.md, Notebook mode): the first event is
    #: ``execution_count``, the value of the last expression is a ``result`` event, an uncaught
    #: exception an ``error`` event, rich outputs are on, IPython's ``!cmd`` and ``%magic`` lines
    #: work and an indented cell is dedented.
    notebook: Optional[bool]


class _OutputEventRequired(TypedDict):
    type: Literal["stdout", "stderr"]
    data: str
    seq: int
    ts: int


class OutputEvent(_OutputEventRequired, total=False):
    """One line of output, without its newline, decoded as UTF-8 with replacement characters; at
    most 65536 bytes (longer lines are split). In a notebook cell, a piece that does not end its
    line has ``partial: true``."""

    #: Notebook cells only: the data does not end its line (a last line without its newline, a piece
    #: of a long line).
    partial: Literal[True]


class DisplayEvent(TypedDict):
    """A rich output of a Python exec that asked for them (``display: true`` or ``notebook: true``):
    a MIME bundle as in Jupyter's display protocol (binary types base64, every bundle has
    ``text/plain``). In a notebook cell it also carries ``application/vnd.hostd.dataframe+json``
    (a DataFrame's columns), ``application/vnd.hostd.chart+json`` (a figure's chart) or
    ``application/json`` (a list's or dict's value)."""

    type: Literal["display"]
    data: Dict[str, Any]
    seq: int
    ts: int


class ExecutionCountEvent(TypedDict):
    """Notebook cells only, first: how many notebook cells the exec's context has run, this one
    included."""

    type: Literal["execution_count"]
    data: int
    seq: int
    ts: int


class ResultEvent(TypedDict):
    """Notebook cells only: the value of the cell's last expression (not None, not ending with
    ``;``), as a MIME bundle like a display event's."""

    type: Literal["result"]
    data: Dict[str, Any]
    seq: int
    ts: int


class CellErrorEvent(TypedDict):
    """Notebook cells only: the cell's uncaught exception (also ``SystemExit`` with a code other
    than 0); nothing goes to stderr for it."""

    type: Literal["error"]
    data: CellError
    seq: int
    ts: int


class ExitEvent(TypedDict):
    """The last event: the exit code of the exec (``124`` on timeout, 128+signal if the Python REPL
    was killed)."""

    type: Literal["exit"]
    data: int
    seq: int
    ts: int


class ExecutorFailureEvent(TypedDict):
    """The last event when the exec could not finish after the stream started (VM died, agent not
    answering, sandbox deleted). Preceded by a ``stderr`` event ``hostd: executor error:
    <reason>``. ``data`` is always -1 (never a real exit code)."""

    type: Literal["exit"]
    data: Literal[-1]
    #: The reason.
    error: str
    seq: int
    ts: int


class ForkRequest(TypedDict):
    #: Number of children; required, no default.
    n: int


class ForkResponse(TypedDict):
    parent_id: SandboxId
    #: In no particular order; each child is ready.
    children: List[Sandbox]


class MergeResponse(TypedDict):
    #: The parent id, now driving the winner's VM.
    id: SandboxId
    state: Literal["ready"]
    #: The winner id, which is gone.
    merged: SandboxId


class Snapshot(TypedDict):
    """A snapshot: a sandbox's whole state kept on disk."""

    snapshot_id: str
    #: The sandbox it was taken from (it may be gone).
    source_sandbox_id: str
    template: str
    #: Disk space it takes.
    size_bytes: int
    created_at: str
    #: Sandboxes created from it that still exist.
    sandboxes: int
    #: The name it was given at snapshot, if any (not unique).
    name: Optional[str]


class SnapshotList(TypedDict):
    snapshots: List[Snapshot]


class SnapshotRequest(TypedDict, total=False):
    """``POST /v1/sandboxes/{id}/snapshot``: no body, ``{}``, or a name."""

    #: A name of yours (printable ASCII; need not be unique).
    name: Optional[str]


class SandboxState(TypedDict):
    id: SandboxId
    state: Literal["ready", "paused"]


class _TimeoutRequestRequired(TypedDict):
    #: Seconds from now; null removes the lifetime.
    timeout: Optional[float]


class TimeoutRequest(_TimeoutRequestRequired, total=False):
    """``POST /v1/sandboxes/{id}/timeout``: a running sandbox's new lifetime."""

    #: What happens when the lifetime is up; absent or null keeps the current choice.
    on_timeout: Optional[Literal["delete", "pause"]]


class Template(TypedDict):
    #: What ``POST /v1/sandboxes`` takes as ``template``.
    name: str
    #: True for the template a create without ``template`` gets (the first).
    default: bool
    #: ``building``: creates get ``503 template_unavailable`` with ``Retry-After``; ``failed``:
    #: creates get ``500 template_failed`` with ``error``.
    state: Literal["building", "ready", "failed"]
    #: Why the template failed (a recipe error, or the failing build step and the end of its log);
    #: null otherwise.
    error: Optional[str]
    #: Guest RAM of each VM: the recipe's unless configuration overrides it.
    memory_mib: int
    vcpus: int
    #: VMs kept restored and ready.
    pool_size: int
    #: Size of each VM's writable disk.
    disk_mib: int
    description: str
    #: Modules already imported in every sandbox's REPL.
    preload: List[str]
    #: Debian packages: once built, the recipe's and every template's base packages; before, the
    #: recipe's.
    debian_packages: List[str]
    #: What pip installed (dependencies included) once built; before, the recipe's requirements.
    python_packages: List[str]
    #: Identifies the build; null until built.
    image_key: Optional[str]
    #: When the image was built; null until built.
    built_at: Optional[str]


class TemplateList(TypedDict):
    templates: List[Template]


class _FileEntryRequired(TypedDict):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    #: Permission bits, e.g. 420 for 0644.
    mode: int
    #: Modification time, milliseconds since the epoch.
    mtime_ms: int


class FileEntry(_FileEntryRequired, total=False):
    """A file, directory, symbolic link or other entry of a sandbox."""

    #: Symbolic links only: where it points.
    target: Optional[str]


class _FileWrittenRequired(TypedDict):
    path: str
    size: int


class FileWritten(_FileWrittenRequired, total=False):
    #: Tar uploads: members extracted, directories included.
    files: int


class CellError(TypedDict):
    """A notebook cell's uncaught exception."""

    #: The exception's class name, e.g. ``NameError``.
    name: str
    #: Its message (``str(exception)``).
    value: str
    #: The traceback as Python prints it, without hostd's own frames.
    traceback: str


class Context(TypedDict):
    """A REPL context (docs/api.md, Contexts): an independent namespace with its own working
    directory and execution count."""

    id: str
    #: Its working directory.
    cwd: str
    #: Notebook cells it has run.
    execution_count: int


class ContextList(TypedDict):
    #: ``default`` first, then in creation order.
    contexts: List[Context]


class ContextCreateRequest(TypedDict, total=False):
    #: The context's id; absent or null: 16 random hex digits.
    id: Optional[str]
    #: An existing directory; absent or null: the default context's directory.
    cwd: Optional[str]


class _DrainReportRequired(TypedDict):
    #: When this round started (each drain is one).
    started_at: str
    #: When it ended; null while it runs (its counts grow).
    ended_at: Optional[str]
    #: Sandboxes it handed to other nodes.
    moved: int
    #: Sandboxes still on the node when it ended (failed ones, and those no node took); null while
    #: it runs.
    left: Optional[int]
    #: Snapshots it handed over, or left to another node holding a copy.
    snapshots_moved: int
    #: Snapshots still on the node when it ended; null while it runs.
    snapshots_left: Optional[int]


class DrainReport(_DrainReportRequired, total=False):
    """A node's last drain since it started. One that ended with something left (``left`` or
    ``snapshots_left`` > 0) leaves the node ``draining``: it takes no creates, and will not
    become ``drained`` by itself; draining it again retries what is left; undraining it returns
    it to ``serving``."""

    #: The ids of the sandboxes counted in ``left``, sorted, at most 100 (``left`` is the count that
    #: holds); null while it runs. Absent from reports of nodes older than it.
    left_sandboxes: Optional[List[str]]
    #: The ids of the snapshots counted in ``snapshots_left``, sorted, at most 100; null while it
    #: runs. Absent from reports of older nodes.
    left_snapshots: Optional[List[str]]
    #: When ``POST /v1/cluster/nodes/{id}/undrain`` returned the node to ``serving`` during or after
    #: this round (a running round then starts no further move); null when none has. Absent from
    #: reports of older nodes.
    undrained_at: Optional[str]


class ClusterNode(TypedDict):
    """A node of the cluster as ``GET /v1/cluster`` shows it."""

    id: str
    #: Where peers and the proxy reach it; null for a node that is down.
    url: Optional[str]
    #: ``serving`` takes creates; ``draining`` takes none and hands its sandboxes and snapshots to
    #: other nodes; ``drained``: a drain moved all its sandboxes and snapshots away; ``down``: its
    #: lease expired while sandboxes still name it.
    state: Literal["serving", "draining", "drained", "down"]
    version: Optional[str]
    started_at: Optional[str]
    #: Sandboxes running there now; for a down node, those the catalog still gives it.
    sandboxes: int
    capacity: Optional[Dict[str, Any]]
    load: Optional[Dict[str, Any]]
    templates: Dict[str, Any]
    #: Its last drain since it started, running or ended; null when it has not drained since, or is
    #: down.
    drain: Optional[DrainReport]


class ClusterInfoEtcd(TypedDict, total=False):
    connected: bool
    pending_writes: int


class ClusterInfo(TypedDict):
    """The cluster as the answering node sees it; ``enabled: false`` on a single hostd."""

    enabled: bool
    #: The node that answered.
    node: Optional[str]
    etcd: Optional[ClusterInfoEtcd]
    nodes: List[ClusterNode]


#: ``sbx_`` + 32 lowercase hex characters from a CSPRNG.
SandboxId = str


#: One line of the exec NDJSON stream. ``seq`` starts at 0 and increases by one per event of the
#: exec; ``ts`` is host wall-clock time in ms.
ExecEvent = Union[
    OutputEvent,
    DisplayEvent,
    ExecutionCountEvent,
    ResultEvent,
    CellErrorEvent,
    ExitEvent,
    ExecutorFailureEvent,
]
