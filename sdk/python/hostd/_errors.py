"""One exception class per kind of failure, each with a stable ``code`` string.

HTTP status to class (the server's ``{"error": message}`` becomes the message):

=============================  ==========================  ========================
Status                         Class                       ``code``
=============================  ==========================  ========================
401, 403                       AuthenticationException     ``authentication_error``
404, 410                       NotFoundException           ``not_found``
400, 413, 415 and other 4xx    InvalidRequestException     ``invalid_request``
429                            LimitReachedException       ``limit_reached``
500                            ExecutorException           ``executor_error``
502, 503, 504                  UnavailableException        ``unavailable``
other                          HostdException              ``hostd_error``
no HTTP response at all        ConnectionException         ``connection_error``
=============================  ==========================  ========================

An exec stream that reports a failure in-stream (an ``exit`` event with an ``error`` field) or
that ends without an ``exit`` event raises ExecutorException with ``status`` None. The codes
are the same strings as the TypeScript SDK's.
"""

from __future__ import annotations

from typing import Any, Optional


class HostdException(Exception):
    """Base class of every exception the SDK raises.

    ``code`` is the stable kind (see the module docstring), ``status`` the HTTP status or None,
    ``message`` the server's message.
    """

    code = "hostd_error"
    #: Lets is_hostd_error recognise exceptions from another copy of the package.
    _hostd_error = True

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __repr__(self) -> str:
        return "%s(%r, status=%r)" % (type(self).__name__, self.message, self.status)


class AuthenticationException(HostdException):
    """401: the API key is missing or not one the server knows."""

    code = "authentication_error"


class NotFoundException(HostdException):
    """404: no such sandbox (never existed, deleted, merged away), template or route."""

    code = "not_found"


class InvalidRequestException(HostdException):
    """400 (and 413, 415, other 4xx): the request was malformed or out of bounds."""

    code = "invalid_request"


class ExecutorException(HostdException):
    """500, or an exec stream that failed after it started: the VM failed to start or died,
    or its agent stopped answering. ``event`` is the in-stream ``exit`` event, if any."""

    code = "executor_error"

    def __init__(self, message: str, status: Optional[int] = None, event: Any = None) -> None:
        super().__init__(message, status)
        self.event = event


class LimitReachedException(HostdException):
    """429: a configured cap is reached (sandboxes alive, requests queued). Retryable."""

    code = "limit_reached"


class UnavailableException(HostdException):
    """503 (and 502, 504): hostd is shutting down or lacks memory or disk. Retryable."""

    code = "unavailable"


class ConnectionException(HostdException):
    """No HTTP response: connection refused, DNS failure, reset before the headers."""

    code = "connection_error"


def is_hostd_error(value: object, code: Optional[str] = None) -> bool:
    """True when ``value`` was raised by any copy of this SDK and, if ``code`` is given, has
    that code::

        if is_hostd_error(e, "not_found"): ...
    """
    if not isinstance(value, BaseException) or getattr(value, "_hostd_error", False) is not True:
        return False
    return code is None or getattr(value, "code", None) == code


def error_for_status(status: int, message: str) -> HostdException:
    """The exception for a non-2xx response."""
    if status in (401, 403):
        return AuthenticationException(message, status)
    if status in (404, 410):
        return NotFoundException(message, status)
    if status == 429:
        return LimitReachedException(message, status)
    if 400 <= status < 500:
        return InvalidRequestException(message, status)
    if status == 500:
        return ExecutorException(message, status)
    if status in (502, 503, 504):
        return UnavailableException(message, status)
    return HostdException(message, status)
