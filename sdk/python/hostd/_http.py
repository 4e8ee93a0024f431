"""The one place that sends requests: headers (authorization, traceparent, content-type), the
mapping of failures onto exception classes, JSON decoding, and line-by-line reading of
streamed responses."""

from __future__ import annotations

import http.client
import json
from typing import Any, Iterator, Optional, Tuple
from urllib.parse import quote

from ._config import ClientConfig
from ._errors import ConnectionException, ExecutorException, HostdException, error_for_status
from ._trace import traceparent

_STREAM_ERRORS = (OSError, http.client.HTTPException, ValueError)


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return "/v1/sandboxes/%s%s" % (quote(sandbox_id, safe=""), suffix)


def _headers(config: ClientConfig, has_body: bool, accept: str) -> dict:
    headers = {"accept": accept, "traceparent": traceparent()}
    if config.api_key is not None:
        headers["authorization"] = "Bearer %s" % config.api_key
    if has_body:
        headers["content-type"] = "application/json"
    return headers


def _connection(config: ClientConfig) -> http.client.HTTPConnection:
    if config.scheme == "https":
        return http.client.HTTPSConnection(config.host, config.port)
    return http.client.HTTPConnection(config.host, config.port)


def _error_message(status: int, reason: str, data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str) and parsed["error"]:
            return parsed["error"]
    except ValueError:
        pass  # not JSON: a proxy's HTML page, say
    text = text.strip()
    if not text:
        return ("HTTP %d %s" % (status, reason)).strip()
    return text if len(text) <= 200 else text[:200] + "…"


def open_response(
    config: ClientConfig,
    method: str,
    path: str,
    body: Any = None,
    accept: str = "application/json",
) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Sends a request; returns the connection and the 2xx response with its body unread, or
    raises the exception for the status. The caller closes the connection."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    conn = _connection(config)
    try:
        headers = _headers(config, data is not None, accept)
        conn.request(method, config.prefix + path, body=data, headers=headers)
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        raise ConnectionException("cannot reach hostd at %s: %s" % (config.base_url, e)) from e
    if 200 <= resp.status < 300:
        return conn, resp
    try:
        payload = resp.read()
    except _STREAM_ERRORS:
        payload = b""
    finally:
        conn.close()
    raise error_for_status(resp.status, _error_message(resp.status, resp.reason, payload))


def request(
    config: ClientConfig, method: str, path: str, body: Any = None, accept: str = "application/json"
) -> bytes:
    """The whole body of a 2xx response."""
    conn, resp = open_response(config, method, path, body, accept)
    try:
        return resp.read()
    except _STREAM_ERRORS as e:
        raise ConnectionException("the connection to hostd broke: %s" % e) from e
    finally:
        conn.close()


def request_json(config: ClientConfig, method: str, path: str, body: Any = None) -> Any:
    data = request(config, method, path, body)
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        raise HostdException("hostd sent a response that is not JSON: %r" % data[:200]) from None


def stream_lines(
    config: ClientConfig, method: str, path: str, body: Any = None, accept: str = "application/x-ndjson"
) -> Iterator[str]:
    """Yields each non-empty line of a 2xx response as soon as its newline arrives. Closing the
    generator early closes the connection, which tells hostd to interrupt the exec."""
    conn, resp = open_response(config, method, path, body, accept)
    try:
        while True:
            try:
                raw: Optional[bytes] = resp.readline()
            except _STREAM_ERRORS as e:
                raise ExecutorException("the exec stream broke: %s" % e) from e
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").strip()
            if line:
                yield line
    finally:
        conn.close()
