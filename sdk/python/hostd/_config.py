"""Where the SDK finds hostd, which key it sends, how long it waits and how often it retries.
Explicit arguments win over the environment:

=============================  ===================  ==================================
Variable                       Argument             Default
=============================  ===================  ==================================
``SERVICE_HOSTD_URL``          ``base_url``         ``http://127.0.0.1:7070``
``SERVICE_API_KEY``            ``api_key``          none (no ``Authorization`` header)
``SERVICE_REQUEST_TIMEOUT_S``  ``request_timeout``  60 seconds; ``0`` waits forever
``SERVICE_MAX_RETRIES``        ``max_retries``      3; ``0`` never retries
=============================  ===================  ==================================

``request_timeout`` is the longest hostd may stay silent: before its answer, and between two
pieces of a body. A request that waits its turn behind a long exec on the same sandbox (a fork,
a second exec) is silent meanwhile, so raise it for those. An exec stream waits its own
``timeout`` plus this once it runs, and forever when it has no ``timeout``.

``max_retries``: how many times a request answered ``429`` or ``503`` is sent again (after the
server's ``Retry-After``, else 0.5 s, 1 s, 2 s, ...). Nothing else is retried, and a
``Retry-After`` over 30 s is not waited for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlsplit

DEFAULT_BASE_URL = "http://127.0.0.1:7070"
DEFAULT_REQUEST_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 3


@dataclass(frozen=True)
class ClientConfig:
    scheme: str
    host: str
    port: int
    #: Path prefix without a trailing slash ("" for a server at the root).
    prefix: str
    api_key: Optional[str]
    #: Seconds; 0 for no timeout.
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES

    @property
    def base_url(self) -> str:
        host = "[%s]" % self.host if ":" in self.host else self.host
        return "%s://%s:%d%s" % (self.scheme, host, self.port, self.prefix)


def _non_empty(value: Optional[str]) -> Optional[str]:
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _number(name: str, raw: str, whole: bool) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0 or value != value or value == float("inf") or (whole and value != int(value)):
        raise ValueError("%s must be %s >= 0, got %r" % (name, "a whole number" if whole else "a number", raw))
    return value


def resolve_config(
    api_key: Optional[str] = None,
    base_url: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    request_timeout: Optional[float] = None,
    max_retries: Optional[int] = None,
) -> ClientConfig:
    """Resolves arguments against the environment (``env`` defaults to ``os.environ``).
    An explicit empty ``api_key`` sends no key."""
    env = os.environ if env is None else env
    raw = base_url if base_url is not None else _non_empty(env.get("SERVICE_HOSTD_URL"))
    raw = raw or DEFAULT_BASE_URL
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("hostd base URL must be an http or https URL, got %r" % raw)
    try:
        port = parts.port
    except ValueError:
        raise ValueError("hostd base URL has an invalid port: %r" % raw) from None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    key = api_key if api_key is not None else _non_empty(env.get("SERVICE_API_KEY"))
    if request_timeout is None:
        raw_timeout = _non_empty(env.get("SERVICE_REQUEST_TIMEOUT_S"))
        timeout = DEFAULT_REQUEST_TIMEOUT if raw_timeout is None else _number("SERVICE_REQUEST_TIMEOUT_S", raw_timeout, False)
    else:
        timeout = _number("request_timeout", str(request_timeout), False)
    if max_retries is None:
        raw_retries = _non_empty(env.get("SERVICE_MAX_RETRIES"))
        retries = DEFAULT_MAX_RETRIES if raw_retries is None else int(_number("SERVICE_MAX_RETRIES", raw_retries, True))
    else:
        retries = int(_number("max_retries", str(max_retries), True))
    return ClientConfig(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        prefix=parts.path.rstrip("/"),
        api_key=key or None,
        request_timeout=timeout,
        max_retries=retries,
    )
