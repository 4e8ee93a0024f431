"""hostd: create sandboxes on a hostd server, run code in them with streamed output, fork and
merge their state. Standard library only.

    from hostd import Sandbox

    with Sandbox.create() as sandbox:
        sandbox.run("x = 42")
        print(sandbox.run("print(x)").stdout)   # "42\\n"
"""

from ._config import DEFAULT_BASE_URL, ClientConfig, resolve_config
from ._errors import (
    AuthenticationException,
    ConnectionException,
    ExecutorException,
    HostdException,
    InvalidRequestException,
    LimitReachedException,
    NotFoundException,
    UnavailableException,
    error_for_status,
    is_hostd_error,
)
from ._sandbox import Sandbox
from ._trace import traceparent
from ._types import ExecEvent, RunResult

__version__ = "0.1.0"

__all__ = [
    "AuthenticationException",
    "ClientConfig",
    "ConnectionException",
    "DEFAULT_BASE_URL",
    "ExecEvent",
    "ExecutorException",
    "HostdException",
    "InvalidRequestException",
    "LimitReachedException",
    "NotFoundException",
    "RunResult",
    "Sandbox",
    "UnavailableException",
    "error_for_status",
    "is_hostd_error",
    "resolve_config",
    "traceparent",
]
