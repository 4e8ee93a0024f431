"""hostd: create sandboxes on a hostd server, run code in them with streamed output, fork and
merge their state, move files in and out, snapshot and pause them. Standard library only; an
asyncio flavour (AsyncSandbox, ...) mirrors the blocking one method for method.

    from hostd import Sandbox

    with Sandbox.create() as sandbox:
        sandbox.run("x = 42")
        print(sandbox.run("print(x)").stdout)   # "42\\n"
"""

from ._async_files import AsyncFiles, AsyncFileStream
from ._async_sandbox import AsyncSandbox
from ._config import DEFAULT_BASE_URL, DEFAULT_MAX_RETRIES, DEFAULT_REQUEST_TIMEOUT, ClientConfig, resolve_config
from ._display import to_display
from ._errors import (
    AuthenticationError,
    AuthenticationException,
    ConnectionException,
    ContextExistsError,
    ContextNotFoundError,
    ExecutorError,
    ExecutorException,
    HostdError,
    HostdException,
    InsufficientResourcesError,
    InsufficientStorageError,
    InvalidRequestError,
    InvalidRequestException,
    LimitReachedError,
    LimitReachedException,
    NotFoundError,
    NotFoundException,
    RateLimitError,
    RequestTimeoutError,
    RouteNotFoundError,
    SandboxDiskFullError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxNotFoundError,
    ShuttingDownError,
    SnapshotNotFoundError,
    StorageLimitError,
    TemplateFailedError,
    TemplateNotFoundError,
    TemplateUnavailableError,
    UnavailableError,
    UnavailableException,
    UnsafeArchiveError,
    error_for_status,
    error_from_response,
    is_hostd_error,
)
from ._files import Files, FileStream
from ._sandbox import Sandbox
from ._snapshot import AsyncSnapshot, Snapshot
from ._template import AsyncTemplate, Template
from ._trace import traceparent
from ._types import (
    CellError,
    ContextInfo,
    Display,
    EntryInfo,
    EventType,
    ExecEvent,
    MergeInfo,
    MimeBundle,
    NetworkInfo,
    RunResult,
    SandboxInfo,
    SnapshotInfo,
    TemplateInfo,
    TransferInfo,
    WriteInfo,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncFileStream",
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncSnapshot",
    "AsyncTemplate",
    "AuthenticationError",
    "AuthenticationException",
    "CellError",
    "ClientConfig",
    "ConnectionException",
    "ContextExistsError",
    "ContextInfo",
    "ContextNotFoundError",
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_REQUEST_TIMEOUT",
    "Display",
    "EntryInfo",
    "EventType",
    "ExecEvent",
    "ExecutorError",
    "ExecutorException",
    "FileStream",
    "Files",
    "HostdError",
    "HostdException",
    "InsufficientResourcesError",
    "InsufficientStorageError",
    "InvalidRequestError",
    "InvalidRequestException",
    "LimitReachedError",
    "LimitReachedException",
    "MergeInfo",
    "MimeBundle",
    "NetworkInfo",
    "NotFoundError",
    "NotFoundException",
    "RateLimitError",
    "RequestTimeoutError",
    "RouteNotFoundError",
    "RunResult",
    "Sandbox",
    "SandboxDiskFullError",
    "SandboxFileNotFoundError",
    "SandboxInfo",
    "SandboxLostError",
    "SandboxNotFoundError",
    "ShuttingDownError",
    "Snapshot",
    "SnapshotInfo",
    "SnapshotNotFoundError",
    "StorageLimitError",
    "Template",
    "TemplateFailedError",
    "TemplateInfo",
    "TemplateNotFoundError",
    "TemplateUnavailableError",
    "TransferInfo",
    "UnavailableError",
    "UnavailableException",
    "UnsafeArchiveError",
    "WriteInfo",
    "error_for_status",
    "error_from_response",
    "is_hostd_error",
    "resolve_config",
    "to_display",
    "traceparent",
]
