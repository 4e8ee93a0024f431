"""Exception classes. hostd answers every error with ``{"error": message, "code": code}``; the
SDK picks the class by ``code`` first and by HTTP status second (a server or a proxy that sends
no code), so that programs branch on classes or on ``code``, never on messages. The classes and
codes are the TypeScript SDK's.

==============================================================  ===========================  =========================
``code`` (docs/api.md)                                          Class                        Parent
==============================================================  ===========================  =========================
``missing_api_key``, ``invalid_api_key``                        AuthenticationError          HostdError
``invalid_request``, ``merge_into_self``, ``invalid_path``,     InvalidRequestError          HostdError
``is_a_directory``, ``not_a_directory``, ``invalid_archive``,
``unsupported_file``, ``permission_denied`` (403), ``request_timeout`` (408),
``body_too_large``, ``file_too_large``,
``unsupported_media_type``, ``headers_too_large`` (431)
``sandbox_not_found``                                           SandboxNotFoundError         NotFoundError
``sandbox_lost`` (410)                                          SandboxLostError             NotFoundError
``template_not_found``                                          TemplateNotFoundError        NotFoundError
``snapshot_not_found``                                          SnapshotNotFoundError        NotFoundError
``file_not_found``                                              SandboxFileNotFoundError     NotFoundError, and the
                                                                                             builtin FileNotFoundError
``route_not_found``                                             RouteNotFoundError           NotFoundError
``context_not_found``                                           ContextNotFoundError         NotFoundError
``context_exists`` (409)                                        ContextExistsError           InvalidRequestError
``context_is_default``                                          InvalidRequestError          HostdError
``limit_reached`` (429)                                         RateLimitError               HostdError
``executor_error``, ``internal_error``                          ExecutorError                HostdError
``template_failed``                                             TemplateFailedError          ExecutorError
``insufficient_resources``                                      InsufficientResourcesError   UnavailableError
``template_unavailable``                                        TemplateUnavailableError     UnavailableError
``shutting_down``                                               ShuttingDownError            UnavailableError
``sandbox_disk_full``                                           SandboxDiskFullError         InsufficientStorageError
``storage_limit_reached``                                       StorageLimitError            InsufficientStorageError
==============================================================  ===========================  =========================

Cluster mode's codes (``node_not_found``, ``not_clustered``, ``sandboxes_on_different_nodes``,
``cluster_conflict``, ``cluster_unavailable``, ``node_unavailable``, ``sandbox_moving``,
``node_draining``, ``hand_over_failed``) have no class of their own: their status decides, and
``code`` tells them apart.

Without a known code, the status decides: 401/403 AuthenticationError, 404 NotFoundError, 410
SandboxLostError, 429 RateLimitError, other 4xx InvalidRequestError, 500 ExecutorError,
502/503/504 UnavailableError, 507 InsufficientStorageError, anything else HostdError. No
response at all is ConnectionException (the TypeScript SDK's ConnectionError: that name is a
Python builtin), and no answer in time RequestTimeoutError.

The first SDK version's ``*Exception`` names are aliases of the matching classes, and its
classes are the parents of the new ones, so code written against them still works.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type


class HostdError(Exception):
    """Base class of every exception the SDK raises.

    ``code`` is the server's machine-readable code (else the class's own), ``status`` the HTTP
    status or None, ``message`` the server's message, ``retry_after_ms`` what ``Retry-After``
    asked for (429 and 503 answers, once the SDK's own retries gave up), or None.
    """

    #: The code of this class: what ``is_hostd_error(e, code)`` matches for it and its subclasses.
    code = "hostd_error"
    #: Lets is_hostd_error recognise exceptions from another copy of the package.
    _hostd_error = True

    def __init__(
        self,
        message: str,
        status: Optional[int] = None,
        *,
        code: Optional[str] = None,
        retry_after_ms: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code if code is not None else type(self).code
        self.retry_after_ms = retry_after_ms

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return "%s(%r, status=%r, code=%r)" % (type(self).__name__, self.message, self.status, self.code)


class AuthenticationError(HostdError):
    """401: the API key is missing (``missing_api_key``) or unknown (``invalid_api_key``)."""

    code = "authentication_error"


class InvalidRequestError(HostdError):
    """400 (and 413, 415): the request was malformed or out of bounds; ``code`` says how."""

    code = "invalid_request"


class NotFoundError(HostdError):
    """404 or 410: the parent of every "no such thing" error."""

    code = "not_found"


class SandboxNotFoundError(NotFoundError):
    """No such sandbox: never existed, deleted, merged away, or a malformed id."""

    code = "sandbox_not_found"


class SandboxLostError(NotFoundError):
    """410: the sandbox's VM died while hostd was not running; delete it and make a new one."""

    code = "sandbox_lost"


class TemplateNotFoundError(NotFoundError):
    """Unknown template name; the message lists the known ones."""

    code = "template_not_found"


class SnapshotNotFoundError(NotFoundError):
    """Unknown or deleted snapshot."""

    code = "snapshot_not_found"


class SandboxFileNotFoundError(NotFoundError, FileNotFoundError):
    """No file or directory at that path inside the sandbox (the sandbox itself exists).

    Also a builtin ``FileNotFoundError``, so ``except FileNotFoundError`` catches a missing
    file in a sandbox as it catches a missing local one.
    """

    code = "file_not_found"


class RouteNotFoundError(NotFoundError):
    """The server has no such route: it is older than this SDK (a feature it lacks yet)."""

    code = "route_not_found"


class ContextNotFoundError(NotFoundError):
    """An exec or a request named a REPL context the sandbox does not have."""

    code = "context_not_found"


class ContextExistsError(InvalidRequestError):
    """A context was created under an id the sandbox already has."""

    code = "context_exists"


class RateLimitError(HostdError):
    """429: a configured cap is reached (sandboxes alive, requests queued on one sandbox). The
    SDK retries these itself (see ``max_retries``); this is raised once it gives up."""

    code = "limit_reached"


class ExecutorError(HostdError):
    """500, or an exec stream that failed after it started: the VM failed to start or died, or
    its agent stopped answering. ``event`` is the in-stream ``exit`` event, if any."""

    code = "executor_error"

    def __init__(self, message: str, status: Optional[int] = None, event: Any = None, **kwargs: Any) -> None:
        super().__init__(message, status, **kwargs)
        self.event = event


class TemplateFailedError(ExecutorError):
    """500: the template's image failed to build; the message has the build's reason."""

    code = "template_failed"


class UnavailableError(HostdError):
    """503 (and 502, 504): the parent of the "not now" errors. The SDK retries 503s itself."""

    code = "unavailable"


class InsufficientResourcesError(UnavailableError):
    """503: the host lacks the memory or disk to start a VM now."""

    code = "insufficient_resources"


class TemplateUnavailableError(UnavailableError):
    """503: the template's image is still being built."""

    code = "template_unavailable"


class ShuttingDownError(UnavailableError):
    """503: hostd received SIGTERM and takes no new work."""

    code = "shutting_down"


class InsufficientStorageError(HostdError):
    """507: a disk is full; nothing was left half-written."""

    code = "insufficient_storage"


class SandboxDiskFullError(InsufficientStorageError):
    """507: the sandbox's own disk is full."""

    code = "sandbox_disk_full"


class StorageLimitError(InsufficientStorageError):
    """507: snapshots and paused sandboxes would exceed the server's SERVICE_MAX_STORAGE_MIB."""

    code = "storage_limit_reached"


class ConnectionException(HostdError):
    """No HTTP response: connection refused, DNS failure, connection reset before the headers.
    (The TypeScript SDK's ConnectionError; Python has a builtin of that name.)"""

    code = "connection_error"


class RequestTimeoutError(ConnectionException):
    """hostd sent nothing for longer than the request timeout (``request_timeout``), before its
    answer or in the middle of a body. The request was abandoned (its connection closed)."""

    code = "request_timeout"


class UnsafeArchiveError(HostdError):
    """A tar entry from a sandbox that would land outside the target directory, or be written
    through a symlink: ``download_dir`` refuses it."""

    code = "unsafe_archive"


# The first SDK version's names.
HostdException = HostdError
AuthenticationException = AuthenticationError
NotFoundException = NotFoundError
InvalidRequestException = InvalidRequestError
ExecutorException = ExecutorError
LimitReachedException = RateLimitError
LimitReachedError = RateLimitError
UnavailableException = UnavailableError

_CLASS_BY_CODE: Dict[str, Type[HostdError]] = {
    "missing_api_key": AuthenticationError,
    "invalid_api_key": AuthenticationError,
    "invalid_request": InvalidRequestError,
    "merge_into_self": InvalidRequestError,
    "invalid_path": InvalidRequestError,
    "is_a_directory": InvalidRequestError,
    "not_a_directory": InvalidRequestError,
    "invalid_archive": InvalidRequestError,
    "unsupported_file": InvalidRequestError,
    "permission_denied": InvalidRequestError,
    "body_too_large": InvalidRequestError,
    "file_too_large": InvalidRequestError,
    "unsupported_media_type": InvalidRequestError,
    "headers_too_large": InvalidRequestError,
    # hostd's 408 (the request's headers came too slowly), not the SDK's own RequestTimeoutError.
    "request_timeout": InvalidRequestError,
    "sandbox_not_found": SandboxNotFoundError,
    "sandbox_lost": SandboxLostError,
    "template_not_found": TemplateNotFoundError,
    "snapshot_not_found": SnapshotNotFoundError,
    "file_not_found": SandboxFileNotFoundError,
    "route_not_found": RouteNotFoundError,
    "context_not_found": ContextNotFoundError,
    "context_exists": ContextExistsError,
    "context_is_default": InvalidRequestError,
    "limit_reached": RateLimitError,
    "executor_error": ExecutorError,
    "internal_error": ExecutorError,
    "template_failed": TemplateFailedError,
    "insufficient_resources": InsufficientResourcesError,
    "template_unavailable": TemplateUnavailableError,
    "shutting_down": ShuttingDownError,
    "sandbox_disk_full": SandboxDiskFullError,
    "storage_limit_reached": StorageLimitError,
}


def _class_for_status(status: int) -> Type[HostdError]:
    if status in (401, 403):
        return AuthenticationError
    if status == 404:
        return NotFoundError
    if status == 410:
        return SandboxLostError
    if status == 429:
        return RateLimitError
    if 400 <= status < 500:
        return InvalidRequestError
    if status == 500:
        return ExecutorError
    if status in (502, 503, 504):
        return UnavailableError
    if status == 507:
        return InsufficientStorageError
    return HostdError


def error_from_response(
    status: int, code: Optional[str], message: str, retry_after_ms: Optional[int] = None
) -> HostdError:
    """The exception for a non-2xx response: the class of its ``code`` when the SDK knows the
    code, else the class of its status. The exception keeps the server's code either way."""
    cls = _CLASS_BY_CODE.get(code) if code is not None else None
    if cls is None:
        cls = _class_for_status(status)
    return cls(message, status=status, code=code, retry_after_ms=retry_after_ms)


def error_for_status(status: int, message: str) -> HostdError:
    """The exception for a status without a code (the first SDK version's entry point)."""
    return error_from_response(status, None, message)


def _class_codes(value: BaseException) -> List[str]:
    """The codes of ``value``'s class and of its parents, nearest first."""
    return [k.__dict__["code"] for k in type(value).__mro__ if isinstance(k.__dict__.get("code"), str)]


def is_hostd_error(value: object, code: Optional[str] = None) -> bool:
    """True when ``value`` was raised by any copy of this SDK and, if ``code`` is given, has
    that code or is of a class with that code (``"not_found"`` matches every NotFoundError)::

        if is_hostd_error(e, "sandbox_not_found"): ...
    """
    if not isinstance(value, BaseException) or getattr(value, "_hostd_error", False) is not True:
        return False
    return code is None or getattr(value, "code", None) == code or code in _class_codes(value)
