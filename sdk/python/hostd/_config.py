"""Where the SDK finds hostd and which key it sends. Explicit arguments win over the
environment: ``SERVICE_HOSTD_URL`` (default ``http://127.0.0.1:7070``) and ``SERVICE_API_KEY``
(default: no key, which a loopback hostd without keys accepts)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlsplit

DEFAULT_BASE_URL = "http://127.0.0.1:7070"


@dataclass(frozen=True)
class ClientConfig:
    scheme: str
    host: str
    port: int
    #: Path prefix without a trailing slash ("" for a server at the root).
    prefix: str
    api_key: Optional[str]

    @property
    def base_url(self) -> str:
        host = "[%s]" % self.host if ":" in self.host else self.host
        return "%s://%s:%d%s" % (self.scheme, host, self.port, self.prefix)


def _non_empty(value: Optional[str]) -> Optional[str]:
    if value is None or value.strip() == "":
        return None
    return value.strip()


def resolve_config(
    api_key: Optional[str] = None,
    base_url: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
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
    return ClientConfig(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        prefix=parts.path.rstrip("/"),
        api_key=key or None,
    )
